#pragma once
/// The elements of a vector, in order. Out: T. State: the next index. The vector is shared, not
/// copied, between workers.
#include <memory>
#include <string>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A from_vector's saved state: the next index.
struct FromVectorState {
  std::uint64_t index = 0;
  template <class A>
  void fields(A& a) { a("index", index); }
};

struct FromVectorOptions {
  std::string name{};
};

template <class T>
class FromVectorDef final : public NodeDef<T>, public RandomAccess<T> {
 public:
  FromVectorDef(std::vector<T> values, FromVectorOptions o)
      : NodeDef<T>("from_vector", o.name, describe(values)),
        values_(std::make_shared<const std::vector<T>>(std::move(values))) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const std::vector<T>& values() const { return *values_; }
  std::uint64_t size() const override { return values_->size(); }
  T at(std::uint64_t i) const override { return (*values_)[i]; }

 private:
  // The fingerprint covers the size and, for Snapshottable types, a digest of the contents, so a
  // snapshot taken over other data is refused.
  static Params describe(const std::vector<T>& v) {
    Params p{{"size", std::to_string(v.size())}};
    if constexpr (Snapshottable<T>) {
      std::uint64_t h = 0;
      ByteWriter w;
      for (const auto& x : v) {
        w.buffer().clear();
        Codec<T>::encode(w, x);
        h = mix64(h ^ fnv1a(w.buffer()));
      }
      p.emplace_back("digest", std::to_string(h));
    }
    return p;
  }
  std::shared_ptr<const std::vector<T>> values_;
};

template <class T>
class FromVectorIter final : public Hooked<T> {
 public:
  FromVectorIter(BuildContext& ctx, const FromVectorDef<T>& def) : Hooked<T>(ctx, "from_vector"), def_(def) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    const auto& v = def_.values();
    const std::size_t n = std::min<std::size_t>(v.size() - st_.index, max);
    out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(st_.index),
               v.begin() + static_cast<std::ptrdiff_t>(st_.index + n));
    if (this->traced())
      for (std::size_t i = 0; i < n; ++i) this->trace_source(st_.index + i);
    st_.index += n;
    return n;
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return true; }
  bool recomputable() const override { return true; }
  T recompute(const Provenance& p) const override { return this->recompute_at(def_, p); }
  bool holds_no_elements() const override { return true; }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    if (st_.index > def_.values().size()) r.fail("index " + std::to_string(st_.index) + " is past the vector's end");
  }
  std::vector<IterBase*> inputs() const override { return {}; }

 private:
  const FromVectorDef<T>& def_;
  FromVectorState st_;
};

template <class T>
std::unique_ptr<Iter<T>> FromVectorDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<FromVectorIter<T>>(ctx, *this);
}

template <class T>
Pipeline<T> from_vector(std::vector<T> values, FromVectorOptions o = {}) {
  return make_pipeline<FromVectorDef<T>>(std::move(values), std::move(o));
}

struct FromVectorKind {
  static constexpr std::string_view name = "from_vector";
  /// Every instance reads all of it.
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t>, const LengthAt&) {
    return count_param(p, "size");
  }
  static constexpr std::string_view doc =
      "The elements of a list, in order; every instance reads all of it (put a sampler after it to deal them).";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "names element i by position i; makes it again from its key";
  static constexpr ParamSchema params[] = {
      {.name = "values", .type = ParamType::values, .doc = "the elements", .positional = true, .fingerprint = "size digest"},
  };
  using State = FromVectorState;
  static constexpr bool source = true;
  /// Rescale: as range's (read it through a sampler to rescale).
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kReadInFull); }
  /// `{"op": "from_vector", "values": [...]}`: integers or strings.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    FromVectorOptions o{.name = s.name()};
    if (s.template holds_list_of<SpecStr>("values")) {
      std::vector<SpecStr> v;
      s.required("values", v);
      return from_vector(std::move(v), o);
    }
    std::vector<SpecInt> v;
    s.required("values", v);
    return from_vector(std::move(v), o);
  }
};

}  // namespace dpipe
