#pragma once
/// The error policy of nodes that read data or run a function on each element (records, parse_json,
/// tokenize, map, filter, flat_map): `fail` stops the run with an error naming the node and the element,
/// `skip` drops the element and counts it. A node that skips keeps its count in its state, so a resumed
/// run goes on counting; the counts show in Run::node_stats() (`skipped`), `dpipe run --stats` and Python's stats.
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/error.hpp"
#include "dpipe/kit/node.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/schema.hpp"
#include "dpipe/kit/state.hpp"
#include "dpipe/value.hpp"

namespace dpipe {

enum class OnDataError { fail, skip };

/// The `on_error` parameter, as a kind's schema declares it.
inline constexpr ParamSchema kOnErrorParam = {
    .name = "on_error", .type = ParamType::choice,
    .doc = "a bad element: fail the run naming it, or skip it and count it", .fallback = "\"fail\"", .choices = "fail|skip"};

/// The `on_error` parameter of a node running a user function (map, filter, flat_map).
inline constexpr ParamSchema kOnErrorFunctionParam = {
    .name = "on_error", .type = ParamType::choice,
    .doc = "an element the function throws on: fail the run naming it, or skip it and count it",
    .fallback = "\"fail\"", .choices = "fail|skip"};

inline std::string on_error_text(OnDataError e) { return e == OnDataError::skip ? "skip" : "fail"; }

/// Whether on_error = skip may drop the element a user function threw `e` on: any exception of the
/// function's own, but none of dpipe's (dpipe::Error: a pipeline's failure or refusal is never the
/// element's fault) and no std::bad_alloc (memory running out is not either). A function object may
/// narrow it with `bool skips(const std::exception&) const` (a Python callable: not KeyboardInterrupt or
/// SystemExit, nor a result of the wrong type). Anything not a std::exception fails the run.
template <class Fn>
bool skippable(const Fn& fn, const std::exception& e) {
  if (dynamic_cast<const Error*>(&e) || dynamic_cast<const std::bad_alloc*>(&e)) return false;
  if constexpr (requires { { fn.skips(e) } -> std::convertible_to<bool>; }) return fn.skips(e);
  return true;
}

/// The state of a node whose only state is what it skipped.
struct SkipCountState {
  std::uint64_t skipped = 0;
  template <class A>
  void fields(A& a) {
    a("skipped", skipped);
  }
};

/// In a catch block of a node running a user function: whether the exception being handled is one its
/// skip policy drops (`skips` on, and skippable), counted in `state` when it is. The caller fails otherwise.
template <class Fn>
bool skip_current_exception(const Fn& fn, bool skips, SkipCountState& state) {
  if (!skips) return false;
  try {
    throw;
  } catch (const std::exception& e) {
    if (!skippable(fn, e)) return false;
  } catch (...) {
    return false;
  }
  ++state.skipped;
  return true;
}

namespace rescale {
/// The rule of a state that is only a skip count: the counts are summed into the first new slot, so the
/// total stays right (nodes/text/parse_json.cpp).
RescaleRule summed_skip_count();
}  // namespace rescale

/// `snapshot show`'s line for a skip count: "N bad WHAT skipped".
inline std::string skip_count_summary(const NodeState& record, const std::string& what) {
  SkipCountState st;
  StateReader r(record);
  r.read(st);
  return std::to_string(st.skipped) + " bad " + what + " skipped";
}

/// What one pull of a converting node gave: how many elements it delivered, and why the element after
/// them is bad when the policy is fail ("" otherwise).
struct ConvertedChunk {
  std::size_t delivered = 0;
  std::string failure{};
};

/// The pull of a node that converts each element into a record (parse_json, tokenize): pulls up to `max`
/// elements from `input` into `scratch` and calls `convert(In&, Value&)`, which returns "" or why the
/// element is bad. Good results go to `out`; a bad element is counted in `state.skipped` (skip) or ends
/// the chunk with the failure, naming the element's number in `seen` (fail). A chunk of bad elements only
/// is skipped whole and the input pulled again. The caller raises the failure after the delivered ones.
/// Traced (`traces` given: the node's), the provenance of each good element is appended to `traces`.
template <class In, class Convert>
ConvertedChunk pull_converted(Iter<In>& input, std::vector<In>& scratch, std::vector<Value>& out, std::size_t max,
                              OnDataError policy, SkipCountState& state, std::uint64_t& seen,
                              std::vector<Provenance>* traces, Convert&& convert) {
  ConvertedChunk c;
  while (c.delivered == 0) {
    scratch.clear();
    if (input.pull(scratch, max) == 0) return c;
    for (std::size_t i = 0; i < scratch.size(); ++i) {
      In& element = scratch[i];
      ++seen;
      Value v;
      std::string why = convert(element, v);
      if (why.empty()) {
        out.push_back(std::move(v));
        if (traces) traces->push_back(std::move(input.traces()[i]));
        ++c.delivered;
      } else if (policy == OnDataError::skip) {
        ++state.skipped;
      } else {
        c.failure = "element " + std::to_string(seen) + " read by this instance in this run: " + why +
                    " (on_error = skip drops such elements)";
        return c;
      }
    }
  }
  return c;
}

}  // namespace dpipe
