#pragma once
/// The error policy of nodes that read data or run a function on each element (records, parse_json,
/// tokenize): `fail` stops the run with an error naming the node and the element, `skip` drops the
/// element and counts it. A node that skips keeps its count in its state, so a resumed run goes on
/// counting; the counts show in Run::node_stats() (`skipped`), `dpipe run --stats` and Python's stats.
#include <cstdint>
#include <string>

#include "dpipe/kit/schema.hpp"
#include "dpipe/kit/state.hpp"

namespace dpipe {

enum class OnDataError { fail, skip };

/// The `on_error` parameter, as a kind's schema declares it.
inline constexpr ParamSchema kOnErrorParam = {
    .name = "on_error", .type = ParamType::choice,
    .doc = "a bad element: fail the run naming it, or skip it and count it", .fallback = "\"fail\"", .choices = "fail|skip"};

inline std::string on_error_text(OnDataError e) { return e == OnDataError::skip ? "skip" : "fail"; }

/// The state of a node whose only state is what it skipped.
struct SkipCountState {
  std::uint64_t skipped = 0;
  template <class A>
  void fields(A& a) {
    a("skipped", skipped);
  }
};

}  // namespace dpipe
