// The op catalogue: every op of the kind list with its schema (dpipe/kit/schema.hpp), rescale rule and state
// fields, and the builtin functions a spec names with "fn". `dpipe ops`, the Python package's node
// functions and docs/ops.md are all made from it.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "dpipe/error.hpp"
#include "dpipe/kit/node_kind.hpp"
#include "ops.hpp"

namespace dpipe {

namespace {

using ordered_json = nlohmann::ordered_json;

/// The items of a separated list (split_list) as a JSON array of strings.
ordered_json items(std::string_view list, char sep) {
  ordered_json out = ordered_json::array();
  split_list(list, sep, [&](std::string_view item) {
    out.push_back(std::string(item));
    return false;
  });
  return out;
}

ordered_json param_json(const ParamSchema& p) {
  ordered_json j;
  j["name"] = p.name;
  j["type"] = param_type_name(p.type);
  j["default"] = p.required() ? ordered_json() : ordered_json::parse(p.fallback);
  j["required"] = p.required();
  j["positional"] = p.positional;
  j["doc"] = p.doc;
  j["tuning"] = p.tuning;
  if (!p.fingerprint.empty()) j["fingerprint"] = items(p.fingerprint, ' ');
  if (!p.torch.empty()) j["torch"] = p.torch;
  if (p.type == ParamType::choice) j["choices"] = items(p.choices, '|');
  return j;
}

ordered_json params_json(std::span<const ParamSchema> params, bool with_name) {
  ordered_json out = ordered_json::array();
  for (const auto& p : params) out.push_back(param_json(p));
  if (with_name) out.push_back(param_json(kNameParam));
  return out;
}

ordered_json catalogue_json() {
  ordered_json out = ordered_json::array();
  for (const KindInfo& k : registered_kinds()) {
    ordered_json j;
    j["op"] = k.name;
    j["doc"] = k.doc;
    j["params"] = params_json(k.params, true);
    j["rescales"] = !k.rescale.refuses();
    if (k.rescale.refuses()) j["rescale_refusal"] = k.rescale.reason();
    j["state"] = k.state_fields;
    j["source"] = k.source;
    // Whether it tells its stream's length (len(loader)); merge's is the sum the graph takes.
    j["length"] = k.length != nullptr || k.segment == SegmentRole::ends_workers;
    if (!k.provenance.empty()) j["provenance"] = k.provenance;
    ordered_json functions = ordered_json::array();
    for (const FunctionSchema& f : spec_functions())
      if (f.taken_by(k.name)) {
        ordered_json fj;
        fj["name"] = f.name;
        fj["doc"] = f.doc;
        fj["params"] = params_json(f.params, false);
        functions.push_back(std::move(fj));
      }
    if (!functions.empty()) j["functions"] = std::move(functions);
    out.push_back(std::move(j));
  }
  return out;
}

std::string default_text(const ordered_json& p) {
  if (p["required"].get<bool>()) return "required";
  return p["default"].is_null() ? "optional" : "default " + p["default"].dump();
}

std::string type_text(const ordered_json& p) {
  std::string t = p["type"].get<std::string>();
  if (p.contains("choices")) {
    t = "";
    for (const auto& c : p["choices"]) t += (t.empty() ? "" : " | ") + c.dump();
  }
  return t;
}

}  // namespace

std::string spec_ops_json(std::string_view only) {
  ordered_json all = catalogue_json();
  if (only.empty()) return all.dump();
  for (auto& op : all)
    if (op["op"] == only) return ordered_json::array({op}).dump();
  std::string known;
  for (const auto& op : all) known += (known.empty() ? "" : ", ") + op["op"].get<std::string>();
  throw ConfigError("unknown op '" + std::string(only) + "' (known: " + known + ")");
}

std::string spec_ops_text(std::string_view only) {
  const ordered_json all = ordered_json::parse(spec_ops_json(only));
  std::string out;
  for (const auto& op : all) {
    out += op["op"].get<std::string>() + (op["source"].get<bool>() ? " (source)" : "") + ": " +
           op["doc"].get<std::string>() + "\n";
    std::size_t width = 0;
    for (const auto& p : op["params"]) width = std::max(width, p["name"].get<std::string>().size());
    for (const auto& p : op["params"]) {
      const std::string name = p["name"].get<std::string>();
      out += "  " + name + std::string(width - name.size() + 2, ' ') + type_text(p) + ", " + default_text(p) +
             (p["positional"].get<bool>() ? ", positional" : "") + (p["tuning"].get<bool>() ? ", tuning" : "") +
             (p.contains("torch") ? ", torch: " + p["torch"].get<std::string>() : "") + ": " +
             p["doc"].get<std::string>() + "\n";
    }
    if (op.contains("functions")) {
      out += "  functions (fn):\n";
      for (const auto& f : op["functions"]) {
        out += "    " + f["name"].get<std::string>() + ": " + f["doc"].get<std::string>() + "\n";
        for (const auto& p : f["params"])
          out += "      " + p["name"].get<std::string>() + "  " + type_text(p) + ", " + default_text(p) + ": " +
                 p["doc"].get<std::string>() + "\n";
      }
    }
    out += "  rescales: " +
           (op["rescales"].get<bool>() ? std::string("yes") : "no, " + op["rescale_refusal"].get<std::string>()) + "\n";
    out += std::string("  length: ") + (op["length"].get<bool>() ? "known" : "unknown") + "\n";
    out += "  provenance: " + (op.contains("provenance") ? op["provenance"].get<std::string>() : std::string("not carried")) + "\n";
    std::string state;
    for (const auto& f : op["state"]) state += (state.empty() ? "" : ", ") + f.get<std::string>();
    out += "  state: " + (state.empty() ? std::string("none") : state) + "\n\n";
  }
  return out;
}

std::string spec_ops_markdown() {
  const ordered_json all = ordered_json::parse(spec_ops_json({}));
  auto cell = [](std::string s) {
    std::string r;
    for (char c : s) r += c == '|' ? std::string("\\|") : std::string(1, c);
    return r;
  };
  std::string out =
      "# Ops\n\n"
      "Every op a spec, the `dpipe` tool and the Python package know, made from each kind's schema (its header\n"
      "in `include/dpipe/nodes/`) by `dpipe ops --markdown`; a test checks that this page is current. Every op\n"
      "also takes `name`, the node's name (its key in snapshots). `dpipe ops --json` prints the same as JSON.\n\n";
  for (const auto& op : all) {
    const std::string name = op["op"].get<std::string>();
    out += "## `" + name + "`" + (op["source"].get<bool>() ? " (source)" : "") + "\n\n" + op["doc"].get<std::string>() + "\n\n";
    if (op["params"].size() > 1) {
      out += "| parameter | type | default | doc |\n|---|---|---|---|\n";
      for (const auto& p : op["params"]) {
        if (p["name"] == "name") continue;
        out += "| `" + p["name"].get<std::string>() + "`" + (p["positional"].get<bool>() ? " (positional)" : "") +
               (p["tuning"].get<bool>() ? " (tuning)" : "") +
               (p.contains("torch") ? " (torch: `" + p["torch"].get<std::string>() + "`)" : "") + " | " +
               cell(type_text(p)) + " | " +
               cell(default_text(p)) + " | " + cell(p["doc"].get<std::string>()) + " |\n";
      }
      out += "\n";
    }
    if (op.contains("functions")) {
      out += "Functions (`fn`):\n\n";
      for (const auto& f : op["functions"]) {
        std::string params;
        for (const auto& p : f["params"])
          params += (params.empty() ? "" : ", ") + ("`" + p["name"].get<std::string>() + "`") +
                    (p["required"].get<bool>() ? "" : " (" + default_text(p) + ")");
        out += "- `" + f["name"].get<std::string>() + "`" + (params.empty() ? "" : " (" + params + ")") + ": " +
               f["doc"].get<std::string>() + "\n";
      }
      out += "\n";
    }
    out += "Rescales: " +
           (op["rescales"].get<bool>() ? std::string("yes.") : "no: " + op["rescale_refusal"].get<std::string>() + ".") +
           " State: ";
    std::string state;
    for (const auto& f : op["state"]) state += (state.empty() ? "" : ", ") + ("`" + f.get<std::string>() + "`");
    out += (state.empty() ? std::string("none") : state) + ".";
    // A node calling a Python callable on each element keeps its input count (IterBase::input_taken).
    const bool takes_fn = std::any_of(op["params"].begin(), op["params"].end(),
                                      [](const auto& p) { return p["name"] == "fn" && p["type"] == "function"; });
    if (takes_fn && !op["source"].get<bool>())
      out += " With a Python callable, also `input_taken` (the elements of its input it has taken, which its "
             "failures count in; a rescale drops it).";
    out += std::string(" Length: ") +
           (op["length"].get<bool>() ? "known" : "unknown (`len(loader)` raises naming it)") + ".";
    out += " Provenance: " +
           (op.contains("provenance") ? op["provenance"].get<std::string>() : std::string("not carried (a traced run refuses it)")) +
           ".\n\n";
  }
  return out;
}

}  // namespace dpipe
