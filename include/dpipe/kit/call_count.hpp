#pragma once
/// Function objects that name the element they fail on by its index in the node's input (a Python
/// callable) count their calls: `calls` (elements of the input they were called on) and
/// `counted_from_resume` (true when the count starts at a resume that did not give it back). The nodes
/// that call one once per input element (filter, flat_map, demux) save the count with their record
/// (IterBase::input_taken) and give it back at restore, so the index runs on across a resume. A count
/// that started at a resume is not saved: the resume after the next snapshot counts from there again.
#include <concepts>
#include <cstdint>
#include <optional>

namespace dpipe {

template <class Fn>
concept CountsCalls = requires(Fn& f) {
  { f.calls } -> std::convertible_to<std::uint64_t>;
  { f.counted_from_resume } -> std::convertible_to<bool>;
};

/// The count to save for `fn`: its calls, or nullopt for a function object that does not count or whose
/// count started at a resume that did not give it back (saved, it would pass for a count from the start).
template <class Fn>
std::optional<std::uint64_t> call_count(const Fn& fn) {
  if constexpr (CountsCalls<Fn>) {
    if (!fn.counted_from_resume) return fn.calls;
  }
  return std::nullopt;
}

/// Gives a restored count back to `fn` (nullopt: the record had none, so it counts from the resume).
template <class Fn>
void restore_call_count(Fn& fn, std::optional<std::uint64_t> taken) {
  if constexpr (CountsCalls<Fn>) {
    fn.calls = taken.value_or(0);
    fn.counted_from_resume = !taken;
  } else {
    (void)fn;
    (void)taken;
  }
}

}  // namespace dpipe
