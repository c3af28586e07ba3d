#pragma once
// Cold-path JSON inside the library (snapshot renderings): nlohmann's ordered json, kept out of the
// public headers.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dpipe {

/// Decodes one natively encoded element into `out`; false if the tag is not native or the bytes do not
/// match it (the public element_to_json is this, dumped).
bool element_to_ordered_json(std::string_view tag, std::string_view bytes, nlohmann::ordered_json& out);

/// Compact JSON text. Text put in through detail::json_text (dpipe/detail/text_json.hpp) is kept exactly,
/// UTF-8 or not; bytes that are not UTF-8 and reached the JSON otherwise become U+FFFD, so the text is
/// always valid JSON.
inline std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dpipe
