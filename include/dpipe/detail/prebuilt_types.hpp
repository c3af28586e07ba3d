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

/// Calls DO(T) for each prebuilt element type.
#define DPIPE_FOR_EACH_PREBUILT_TYPE(DO)                                                        \
  DO(std::int64_t) DO(std::string) DO(std::vector<std::int64_t>) DO(std::vector<std::string>) \
  DO(std::vector<std::vector<std::int64_t>>) DO(std::vector<std::vector<std::string>>)        \
  DO(Value) DO(std::vector<Value>)
