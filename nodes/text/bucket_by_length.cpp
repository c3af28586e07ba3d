// bucket_by_length: the buckets, their batches, the options' checks and the rescale rule.
#include "dpipe/nodes/bucket_by_length.hpp"

#include <algorithm>

namespace dpipe {

Params BucketByLengthKind::checked_params(const BucketByLengthOptions& o) {
  const std::string node = node_label("bucket_by_length", o.name);
  for (std::size_t i = 0; i < o.boundaries.size(); ++i)
    if (o.boundaries[i] <= 0 || (i > 0 && o.boundaries[i] <= o.boundaries[i - 1]))
      throw ConfigError(node + ": boundaries must be positive and ascending");
  if (o.max_tokens < 0) throw ConfigError(node + ": max_tokens must not be negative");
  if (o.max_tokens > 0 && !o.batch_sizes.empty())
    throw ConfigError(node + ": give batch_sizes or max_tokens, not both");
  if (o.max_tokens == 0) {
    if (o.batch_sizes.size() != o.boundaries.size() + 1)
      throw ConfigError(node + ": " + std::to_string(o.batch_sizes.size()) + " batch_sizes for " +
                        std::to_string(o.boundaries.size() + 1) + " buckets (one more than the boundaries), or give max_tokens");
    for (const auto b : o.batch_sizes)
      if (b <= 0) throw ConfigError(node + ": batch_sizes must be positive");
  }
  if (o.field.empty()) throw ConfigError(node + ": field must name a field");
  auto list = [](const std::vector<std::int64_t>& v) {
    std::string s;
    for (const auto x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return s;
  };
  return {{"boundaries", list(o.boundaries)}, {"batch_sizes", list(o.batch_sizes)}, {"max_tokens", param_text(o.max_tokens)},
          {"field", o.field}, {"pad", param_text(o.pad)}, {"drop_last", param_text(o.drop_last)}};
}

namespace detail {

Buckets::Buckets(const BucketByLengthOptions& o)
    : o_(o), pad_{.pad = o.pad}, buckets_(o.boundaries.size() + 1), longest_(o.boundaries.size() + 1, 0) {}

std::string Buckets::add(Value element, std::deque<Value>& made) {
  const Value* f = find_field(element, o_.field);
  if (!f) return is_record(element) ? "an element has no field '" + o_.field + "'" : "an element is not a record";
  if (f->kind != Value::Kind::array || f->as_array().shape.size() != 1)
    return "field '" + o_.field + "' is not a 1-D array";
  const std::size_t length = f->as_array().shape[0];
  std::size_t b = 0;
  while (b < o_.boundaries.size() && length >= static_cast<std::uint64_t>(o_.boundaries[b])) ++b;
  if (o_.max_tokens > 0 && !buckets_[b].empty()) {
    const std::size_t longest = std::max(longest_[b], length);
    if ((buckets_[b].size() + 1) * longest > static_cast<std::uint64_t>(o_.max_tokens))
      if (std::string why = emit(b, made); !why.empty()) return why;
  }
  buckets_[b].push_back({seq_++, length, std::move(element)});
  longest_[b] = std::max(longest_[b], length);
  if (o_.max_tokens == 0 && buckets_[b].size() == static_cast<std::size_t>(o_.batch_sizes[b])) return emit(b, made);
  return {};
}

std::string Buckets::emit(std::size_t b, std::deque<Value>& made) {
  std::vector<Value> batch;
  batch.reserve(buckets_[b].size());
  for (auto& e : buckets_[b]) batch.push_back(std::move(e.element));
  buckets_[b].clear();
  longest_[b] = 0;
  std::string why;
  Value v = pad_batch(batch, pad_, why);
  if (why.empty()) made.push_back(std::move(v));
  return why;
}

std::string Buckets::finish(std::deque<Value>& made) {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].empty()) continue;
    if (o_.drop_last) {
      buckets_[b].clear();
      longest_[b] = 0;
    } else if (std::string why = emit(b, made); !why.empty()) {
      return why;
    }
  }
  return {};
}

std::vector<Value> Buckets::waiting() const {
  std::vector<const Entry*> all;
  for (const auto& bucket : buckets_)
    for (const auto& e : bucket) all.push_back(&e);
  std::sort(all.begin(), all.end(), [](const Entry* a, const Entry* b) { return a->seq < b->seq; });
  std::vector<Value> out;
  out.reserve(all.size());
  for (const Entry* e : all) out.push_back(e->element);
  return out;
}

}  // namespace detail

RescaleRule BucketByLengthKind::rescale() {
  return RescaleRule::dealt([](const RescaleInput& in) {
    using S = BucketState<ElementBlobs>;
    in.check_fields<S>();
    const auto waiting = in.deal(&S::waiting);
    const auto made = in.deal(&S::made);
    return in.write_slots([&](std::size_t j) { return S{.waiting = waiting[j], .made = made[j], .input_done = false}; });
  });
}

}  // namespace dpipe
