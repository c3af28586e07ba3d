#pragma once
/// The element types whose code libdpipe compiles once (engine/prebuilt.cpp): integers, strings, Values
/// and batches of them, the types the JSON spec front end and most programs run. For them, dpipe/engine.hpp
/// declares Run, the merge and its worker lanes `extern template`, and so do the headers of dispatch and
/// of the kinds whose only parameter is the element type (shuffle, sharding_filter, sampler, take, cycle,
/// prefetch; batch for the scalar types): a program links that code instead of compiling it. Other types
/// are compiled where they are used, as any template.
#include <cstdint>
#include <string>
#include <vector>

#include "dpipe/value.hpp"

/// Calls DO(T), or DO(T, args...) when arguments follow DO, for each prebuilt element type.
#define DPIPE_FOR_EACH_PREBUILT_TYPE(DO, ...)                                                         \
  DO(std::int64_t __VA_OPT__(, ) __VA_ARGS__) DO(std::string __VA_OPT__(, ) __VA_ARGS__)            \
  DO(std::vector<std::int64_t> __VA_OPT__(, ) __VA_ARGS__)                                         \
  DO(std::vector<std::string> __VA_OPT__(, ) __VA_ARGS__)                                          \
  DO(std::vector<std::vector<std::int64_t>> __VA_OPT__(, ) __VA_ARGS__)                             \
  DO(std::vector<std::vector<std::string>> __VA_OPT__(, ) __VA_ARGS__)                              \
  DO(Value __VA_OPT__(, ) __VA_ARGS__) DO(std::vector<Value> __VA_OPT__(, ) __VA_ARGS__)

/// The same for the scalar ones (batch is prebuilt for these: their batches are prebuilt types too).
#define DPIPE_FOR_EACH_PREBUILT_SCALAR_TYPE(DO, ...)                                       \
  DO(std::int64_t __VA_OPT__(, ) __VA_ARGS__) DO(std::string __VA_OPT__(, ) __VA_ARGS__) \
  DO(Value __VA_OPT__(, ) __VA_ARGS__)

/// In a kind's header: its `Def<T>` and `Iter<T>` are compiled in libdpipe (engine/prebuilt.cpp).
#define DPIPE_EXTERN_NODE_TEMPLATES(T, Def, Iter) \
  extern template class Def<T>;                   \
  extern template class Iter<T>;
/// DPIPE_EXTERN_NODE_TEMPLATES for every prebuilt element type.
#define DPIPE_DECLARE_PREBUILT_NODE(Def, Iter) DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_EXTERN_NODE_TEMPLATES, Def, Iter)
