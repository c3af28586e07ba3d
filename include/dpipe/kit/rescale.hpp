#pragma once
/// Rescale rules: how the records of one node kind are dealt to another layout. Each kind declares its
/// rule next to its State, in its own header (`XKind::rescale()`); the driver (SnapshotSet::rescaled)
/// hands a rule the records of every old instance of one node together and places what it returns. The
/// driver never names a kind or a field: rules read and write records through the kind's own `fields`
/// visitor, instantiated on ElementBlobs so that elements stay encoded.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpipe/error.hpp"
#include "dpipe/layout.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/kit/state.hpp"

namespace dpipe {

namespace rescale {
/// Every slot is kept (deal's default).
struct AllSlots {
  bool operator()(std::size_t) const { return true; }
};
/// The parts of a deal (RescaleInput::deal_fields): those of the wanted slots, held; every other empty.
class DealtParts {
 public:
  DealtParts(std::size_t parts, std::size_t first, std::vector<ElementBlobs> held, std::string tag)
      : parts_(parts), first_(first), held_(std::move(held)) {
    empty_.tag = std::move(tag);
  }
  std::size_t size() const { return parts_; }
  const ElementBlobs& operator[](std::size_t p) const {
    return p >= first_ && p - first_ < held_.size() ? held_[p - first_] : empty_;
  }

 private:
  std::size_t parts_, first_;
  std::vector<ElementBlobs> held_;
  ElementBlobs empty_;
};
/// A `fields` visitor that lists the names of a state's fields and the field type each is written as.
struct FieldNames {
  std::vector<std::string> names;
  std::vector<FieldType> types;
  template <class T>
  void operator()(std::string_view name, T&) {
    names.emplace_back(name);
    if constexpr (std::is_same_v<T, bool> || (std::is_integral_v<T> && std::is_unsigned_v<T>)) types.push_back(FieldType::u64);
    else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) types.push_back(FieldType::i64);
    else if constexpr (std::is_same_v<T, std::string>) types.push_back(FieldType::str);
    else types.push_back(FieldType::elements);
  }
};
/// A `fields` visitor that finds the name of the field at one address (a member pointer's, in a state).
struct FieldAt {
  const void* target;
  std::string name{};
  template <class T>
  void operator()(std::string_view n, T& v) {
    if (static_cast<const void*>(&v) == target) name = n;
  }
};

/// The name state S's `fields` visitor gives member `member`: a rule names fields through the State type,
/// so a misspelled field does not compile. A member the visitor does not visit is a bug of the rule; a
/// field visited only for some values (dispatch's, past its owner flag) is read by name after
/// check_fields(prototype), which checks the name against the prototype's fields.
template <class S, class M>
std::string field_name(M S::*member) {
  S state{};
  FieldAt at{&(state.*member)};
  state.fields(at);
  if (at.name.empty()) throw std::logic_error("internal: a rescale rule names a member its state's fields visitor does not visit");
  return at.name;
}

/// One number per old slot, as a rule reads a column of them: held; or, for a column whose numbers step
/// evenly (all one number: a step of 0), computed; or read one at a time as they are asked for (a set
/// index's column whose least and greatest its directory states: OldColumns::numbers_on_demand).
class Numbers {
 public:
  using Reader = std::function<std::uint64_t(std::size_t)>;
  Numbers() = default;
  explicit Numbers(std::vector<std::uint64_t> values) : values_(std::move(values)), size_(values_.size()) {}
  Numbers(std::size_t size, std::uint64_t first, std::uint64_t step) : size_(size), first_(first), step_(step), even_(true) {}
  Numbers(std::size_t size, Reader read, std::uint64_t least, std::uint64_t greatest)
      : size_(size), read_(std::move(read)), least_(least), greatest_(greatest) {}
  std::size_t size() const { return size_; }
  std::uint64_t operator[](std::size_t i) const {
    return even_ ? first_ + std::uint64_t(i) * step_ : read_ ? read_(i) : values_[i];
  }
  /// The same numbers held (each read once where they are read on demand).
  Numbers held() const {
    if (!read_) return *this;
    std::vector<std::uint64_t> out(size_);
    for (std::size_t i = 0; i < size_; ++i) out[i] = read_(i);
    return Numbers(std::move(out));
  }
  /// The one number of a column computed as one (a progression of step 0), without a pass; else nullopt.
  std::optional<std::uint64_t> one_value() const {
    if (even_ && (step_ == 0 || size_ == 1)) return first_;
    return std::nullopt;
  }
  /// Whether every number is `n`.
  bool all_equal(std::uint64_t n) const {
    if (even_) return size_ == 0 || (first_ == n && (step_ == 0 || size_ == 1));
    if (read_ && (n < least_ || n > greatest_)) return size_ == 0;
    if (read_ && least_ == n && greatest_ == n) return true;
    for (std::size_t i = 0; i < size_; ++i)
      if ((*this)[i] != n) return false;
    return true;
  }
  /// Whether number i is `first` + i × `step` for every i (by the form, without a pass, where it steps evenly).
  bool steps(std::uint64_t first, std::uint64_t step) const {
    if (even_) return size_ == 0 || (first_ == first && (step_ == step || size_ == 1));
    for (std::size_t i = 0; i < size_; ++i)
      if ((*this)[i] != first + std::uint64_t(i) * step) return false;
    return true;
  }
  /// The smallest number (none: the largest u64).
  std::uint64_t min() const {
    std::uint64_t out = ~std::uint64_t{0};
    if (size_ && read_) return least_;
    if (size_ && even_ && !wraps()) return first_;  // it does not wrap: its first is its least
    for (std::size_t i = 0; i < size_; ++i) out = std::min(out, (*this)[i]);
    return out;
  }
  /// The largest number (none: 0).
  std::uint64_t max() const {
    std::uint64_t out = 0;
    if (size_ && read_) return greatest_;
    if (size_ && even_ && !wraps()) return (*this)[size_ - 1];
    for (std::size_t i = 0; i < size_; ++i) out = std::max(out, (*this)[i]);
    return out;
  }

 private:
  /// Whether an even column passes 2^64 (its numbers are modulo 2^64, so its ends are not its bounds).
  bool wraps() const {
    std::uint64_t span = 0, last = 0;
    return __builtin_mul_overflow(std::uint64_t(size_ - 1), step_, &span) || __builtin_add_overflow(first_, span, &last);
  }

  std::vector<std::uint64_t> values_;
  std::size_t size_ = 0;
  std::uint64_t first_ = 0, step_ = 0;
  bool even_ = false;
  Reader read_{};
  std::uint64_t least_ = 0, greatest_ = 0;  // of numbers read on demand
};

}  // namespace rescale

/// The old records of one node as columns (a rescale from a set index, serialize/set_index.hpp): a rule
/// reads them as it reads records (RescaleInput::read), and no record is built that no rule reads.
class OldColumns {
 public:
  virtual ~OldColumns() = default;
  /// Old slots, in slot order (by instance).
  virtual std::size_t size() const = 0;
  virtual std::uint32_t instance(std::size_t i) const = 0;
  /// `step` when slot i's instance is i × step for every slot, else 0.
  virtual std::uint32_t instance_step() const { return 0; }
  virtual StateMode mode(std::size_t i) const = 0;
  /// Slot i's fields, as a StateReader reads them (one slot's at a time).
  virtual const FieldSource& fields(std::size_t i) const = 0;
  /// Column `k` by name, without reading a record: its position, or −1 when no record has it.
  virtual std::ptrdiff_t column(std::string_view name) const = 0;
  /// Whether every row has column k.
  virtual bool everywhere(std::size_t k) const = 0;
  /// Whether slot i's record has field k; its value (0, "" or an empty list when it has none).
  virtual bool has(std::size_t i, std::size_t k) const = 0;
  virtual std::uint64_t number(std::size_t i, std::size_t k) const = 0;  // u64, or i64's bits
  virtual std::string_view text(std::size_t i, std::size_t k) const = 0;
  virtual std::uint64_t list_size(std::size_t i, std::size_t k) const = 0;
  /// The first slot whose text (column k, of type str) is not empty; size() when none is.
  virtual std::size_t first_text(std::size_t k) const {
    for (std::size_t i = 0; i < size(); ++i)
      if (has(i, k) && !text(i, k).empty()) return i;
    return size();
  }
  /// Column k's numbers (number(), or list_size() for a list column) of every slot, in slot order.
  virtual rescale::Numbers all_numbers(std::size_t k) const {
    std::vector<std::uint64_t> out(size());
    const bool lists = column_type(k) == FieldType::elements;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = lists ? list_size(i, k) : number(i, k);
    return rescale::Numbers(std::move(out));
  }
  /// Column k's numbers as all_numbers gives them, for a rule that reads a few of them and their least
  /// and greatest: read as they are asked for where the columns know those bounds beforehand.
  virtual rescale::Numbers numbers_on_demand(std::size_t k) const { return all_numbers(k); }
  /// Slot i's list k: its elements, or ranges of them for the driver to load.
  virtual ElementBlobs list(std::size_t i, std::size_t k) const = 0;
  /// Column k's element tag.
  virtual const std::string& tag(std::size_t k) const = 0;
  virtual std::size_t column_count() const = 0;
  virtual const std::string& column_name(std::size_t k) const = 0;
  virtual FieldType column_type(std::size_t k) const = 0;
};

/// The records of one node on every old instance, in order, and the old and new layouts (rank unused).
/// A node that runs once per rank (before dispatch, after merge) has one record per rank ("slot" = rank);
/// any other has one per instance (slot = rank × workers + worker). The records are in memory (`old`) or
/// columns of a set index (`columns`); a rule reads them through the column reads, read_one(), read() and
/// deal_fields(), never through `old` or `columns` directly.
struct RescaleInput {
  std::vector<const NodeState*> old;
  Layout from, to;
  bool once_per_rank = false;
  const GraphNodeRecord* node = nullptr;  // the node's graph record (kind, parameters); null for engine nodes
  /// The new ranks whose records are wanted: [wanted_begin, wanted_end), or every rank from wanted_begin on
  /// when wanted_end is negative. A rank resuming from a set wants its own; an offline rescale, a batch.
  int wanted_begin = 0, wanted_end = -1;
  const OldColumns* columns = nullptr;  // instead of `old`
  std::string key{}, kind{};            // the node's (when empty: those of old.front())
  StateMode mode = StateMode::hook;     // the node's (old.front()'s when `old` is given)
  /// The field names of the state the rule checked the records against (check_fields): every field read by
  /// name must be one of them, so a misspelled name refuses the rescale instead of reading nothing.
  mutable std::vector<std::string> checked_fields{};

  const std::string& node_key() const { return key.empty() && !old.empty() ? old.front()->key : key; }
  const std::string& node_kind() const { return kind.empty() && !old.empty() ? old.front()->kind : kind; }
  StateMode node_mode() const { return columns || old.empty() ? mode : old.front()->mode; }

  /// How many old slots there are.
  std::size_t old_slots() const { return columns ? columns->size() : old.size(); }
  /// Whether the node's records have a field `name`.
  bool has_field(std::string_view name) const {
    if (columns) return columns->column(name) >= 0;
    const auto& fields = old.front()->fields;
    return std::any_of(fields.begin(), fields.end(), [&](const Field& f) { return f.name == name; });
  }
  /// Old slot i's record, whole.
  NodeState record(std::size_t i) const {
    if (!columns) return *old[i];
    NodeState s{node_key(), node_kind(), columns->instance(i), columns->mode(i), {}};
    const FieldSource& src = columns->fields(i);
    for (std::size_t k = 0; k < src.field_count(); ++k) s.fields.push_back(src.field(k));
    return s;
  }

  std::size_t new_slots() const {
    return static_cast<std::size_t>(once_per_rank ? to.world_size : to.instances());
  }
  /// Whether new slot `j`'s record is wanted: a rule computes every slot (the deal depends on all of
  /// them) but builds the records of the wanted ones only, so a rank's rescale holds what it receives.
  bool wanted(std::size_t j) const {
    const std::size_t rank = once_per_rank ? j : j / static_cast<std::size_t>(to.num_workers);
    return rank >= static_cast<std::size_t>(wanted_begin) && (wanted_end < 0 || rank < static_cast<std::size_t>(wanted_end));
  }
  /// Throws the SnapshotError of a refused rescale, naming this node.
  [[noreturn]] void refuse(const std::string& why) const {
    throw SnapshotError("cannot rescale: node '" + node_key() + "' (" + node_kind() + "): " + why);
  }

  /// Columns of the old records, one value per old slot, read without building any record: the sizes of
  /// list field `name`, the values of u64 field `name` (0 where a record has no such field), of str field
  /// `name` ("" where none).
  rescale::Numbers list_sizes(std::string_view name) const {
    require_field(name);
    return number_values(name, FieldType::elements, [](const Field& f) { return std::uint64_t(f.elements.size()); });
  }
  rescale::Numbers numbers(std::string_view name) const {
    require_field(name);
    return number_values(name, FieldType::u64, [](const Field& f) { return f.u; });
  }
  /// numbers(name) for a rule that reads a few of them and their min() and max(): from a set index,
  /// read one at a time as they are asked for (Numbers::held() reads them all once).
  rescale::Numbers numbers_on_demand(std::string_view name) const {
    require_field(name);
    if (!columns) return numbers(name);
    const std::ptrdiff_t k = typed_column(name, FieldType::u64);
    if (k < 0) return rescale::Numbers(old_slots(), 0, 0);
    auto out = columns->numbers_on_demand(static_cast<std::size_t>(k));
    if (out.size() != old_slots()) refuse("its field '" + columns->column_name(static_cast<std::size_t>(k)) + "' has a value for another number of slots");
    return out;
  }
  /// The first old slot whose str field `name` is not empty, and its text; nullopt when every one is.
  std::optional<std::pair<std::size_t, std::string>> first_text(std::string_view name) const {
    require_field(name);
    if (columns) {
      const std::ptrdiff_t k = typed_column(name, FieldType::str);
      if (k < 0) return std::nullopt;
      if (const std::size_t i = columns->first_text(static_cast<std::size_t>(k)); i < old_slots())
        return std::pair{i, std::string(columns->text(i, static_cast<std::size_t>(k)))};
      return std::nullopt;
    }
    const auto all = texts(name);
    for (std::size_t i = 0; i < all.size(); ++i)
      if (!all[i].empty()) return std::pair{i, all[i]};
    return std::nullopt;
  }
  std::vector<std::string> texts(std::string_view name) const {
    require_field(name);
    if (!columns) return field_values<std::string>(name, FieldType::str, [](const Field& f) { return f.s; });
    std::vector<std::string> out(old_slots());
    if (const std::ptrdiff_t k = typed_column(name, FieldType::str); k >= 0)
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = columns->text(i, static_cast<std::size_t>(k));
    return out;
  }

  /// The same reads naming the field through the state type: `in.numbers(&S::input_done)`.
  template <class S, class M>
  rescale::Numbers numbers(M S::*member) const {
    return numbers(rescale::field_name(member));
  }
  template <class S, class M>
  rescale::Numbers numbers_on_demand(M S::*member) const {
    return numbers_on_demand(rescale::field_name(member));
  }
  template <class S, class M>
  rescale::Numbers list_sizes(M S::*member) const {
    return list_sizes(rescale::field_name(member));
  }
  template <class S, class M>
  std::vector<std::string> texts(M S::*member) const {
    return texts(rescale::field_name(member));
  }
  template <class S, class M>
  std::vector<bool> present(M S::*member) const {
    return present(rescale::field_name(member));
  }

  /// Refuses (SnapshotError) a field name that is not one of the checked state's fields.
  void require_field(std::string_view name) const {
    if (checked_fields.empty())
      refuse("its rule reads field '" + std::string(name) + "' before check_fields<State>() named its state's fields");
    for (const auto& f : checked_fields)
      if (f == name) return;
    refuse("its rule reads a field '" + std::string(name) + "', which its state has not (it has " + [&] {
      std::string all;
      for (const auto& f : checked_fields) all += (all.empty() ? "" : ", ") + f;
      return all;
    }() + ")");
  }

  /// Checks that the old records are states `S` (`prototype` with every optional field present: a
  /// dispatcher's, say, as on the worker that owns it), for a rule that reads them by columns: records in
  /// memory are each read whole, as read() does; columns must be S's fields, in its order, of its types,
  /// and (unless `every_row` is false, for a state whose fields depend on a value, checked by the rule
  /// with present()) on every record.
  template <class S>
  void check_fields(S prototype = S{}, bool every_row = true) const {
    rescale::FieldNames visit;
    prototype.fields(visit);
    checked_fields = visit.names;
    if (!columns) {
      (void)read<S>(prototype);
      return;
    }
    const std::size_t n = columns->column_count();
    for (std::size_t k = 0; k < std::max(n, visit.names.size()); ++k) {
      if (k >= n) refuse("its records lack the field '" + visit.names[k] + "'");
      const std::string& name = columns->column_name(k);
      if (k >= visit.names.size() || name != visit.names[k])
        refuse("its records have a field '" + name + "' where its state " +
               (k < visit.names.size() ? "has '" + visit.names[k] + "'" : "has no more"));
      if (columns->column_type(k) != visit.types[k]) refuse("its field '" + name + "' has another type than its state's");
      if (every_row && !columns->everywhere(k)) refuse("some of its records lack the field '" + name + "'");
    }
  }
  /// Whether each old slot's record has field `name`.
  std::vector<bool> present(std::string_view name) const {
    require_field(name);
    std::vector<bool> out(old_slots(), false);
    if (columns) {
      const std::ptrdiff_t k = columns->column(name);
      if (k >= 0)
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = columns->has(i, static_cast<std::size_t>(k));
      return out;
    }
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = std::any_of(old[i]->fields.begin(), old[i]->fields.end(), [&](const Field& f) { return f.name == name; });
    return out;
  }

  /// Old slot i's record read into `state` by its `fields` visitor.
  template <class S>
  S read_one(std::size_t i, S state = S{}) const {
    if (columns) {
      StateReader r(node_key(), columns->instance(i), columns->fields(i));
      r.read(state);
      r.finish();
    } else {
      StateReader r(*old[i]);
      r.read(state);
      r.finish();
    }
    return state;
  }

  /// The element lists `fields` of the old records pooled in slot order (per slot, the fields in the
  /// order given; a record without one adds nothing; slots for which `include(i)` is false add nothing)
  /// and dealt like deal(): only the parts of wanted slots are built, from the lists they take elements
  /// from, so a node's lists are never all read.
  template <class Include = rescale::AllSlots>
  rescale::DealtParts deal_fields(const std::vector<std::string>& fields, std::size_t per_slot = 1,
                                  Include include = {}) const;
  /// deal_fields of one field named through the state type: `in.deal(&S::partial)`.
  template <class S, class M>
  rescale::DealtParts deal(M S::*member, std::size_t per_slot = 1) const {
    return deal_fields({rescale::field_name(member)}, per_slot);
  }

  /// The wanted new slots: [first, end).
  std::pair<std::size_t, std::size_t> wanted_slots() const {
    const std::size_t per_rank = once_per_rank ? 1 : static_cast<std::size_t>(to.num_workers);
    const std::size_t ranks = static_cast<std::size_t>(to.world_size);
    const std::size_t begin = std::min(ranks, static_cast<std::size_t>(std::max(wanted_begin, 0)));
    const std::size_t end = wanted_end < 0 ? ranks : std::clamp(static_cast<std::size_t>(wanted_end), begin, ranks);
    return {begin * per_rank, end * per_rank};
  }
  /// The records of the wanted new slots: `make(j)` is the state of slot j, written with the node's
  /// field names (a rule that builds only what its rank receives; see RescaleRule for the contract).
  template <class Make>
  std::vector<NodeState> write_slots(Make make) const {
    const auto [first, end] = wanted_slots();
    std::vector<NodeState> out(end - first);
    for (std::size_t j = first; j < end; ++j) {
      out[j - first] = empty_record(j);
      StateWriter w(out[j - first]);
      const auto state = make(j);
      w.write(state);
    }
    return out;
  }

  /// Every old record read into a state struct `S` by its `fields` visitor (the node's own names and order).
  template <class S>
  std::vector<S> read(const S& prototype = S{}) const {
    std::vector<S> out(old_slots(), prototype);  // a prototype sizes per-worker lists before they are read
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (columns) {
        StateReader r(node_key(), columns->instance(i), columns->fields(i));
        r.read(out[i]);
        r.finish();
      } else {
        StateReader r(*old[i]);
        r.read(out[i]);
        r.finish();
      }
    }
    return out;
  }
  /// One new record per state, for slots 0, 1, …, keyed like the old ones (a slot that is not wanted gets
  /// an empty record, which the driver drops).
  template <class S>
  std::vector<NodeState> write(const std::vector<S>& states) const {
    std::vector<NodeState> out(states.size());
    for (std::size_t j = 0; j < states.size(); ++j) {
      if (!wanted(j)) continue;
      out[j] = empty_record(j);
      StateWriter w(out[j]);
      w.write(states[j]);
    }
    return out;
  }
  /// Element lists pooled in order and dealt in contiguous runs (rescale::deal) to `per_slot` parts of each
  /// new slot (merge deals to every worker of a rank): the parts of wanted slots only are filled.
  std::vector<ElementBlobs> deal(const std::vector<const ElementBlobs*>& lists, std::size_t per_slot = 1) const;

  /// One number per old slot of field `name` (0 where a record has none): a column's as the columns give
  /// them (computed where they step evenly), `of_field` of each record's field.
  template <class OfField>
  rescale::Numbers number_values(std::string_view name, FieldType type, OfField of_field) const {
    if (!columns) return rescale::Numbers(field_values<std::uint64_t>(name, type, of_field));
    const std::ptrdiff_t k = typed_column(name, type);
    return k < 0 ? rescale::Numbers(old_slots(), 0, 0) : column_numbers(static_cast<std::size_t>(k));
  }
  /// Column k's numbers (list sizes for a list column), one per old slot.
  rescale::Numbers column_numbers(std::size_t k) const {
    auto out = columns->all_numbers(k);
    if (out.size() != old_slots()) refuse("its field '" + columns->column_name(k) + "' has a value for another number of slots");
    return out;
  }
  /// The column of field `name` (−1 when no record has it), refused when its values are not of `type`.
  std::ptrdiff_t typed_column(std::string_view name, FieldType type) const {
    const std::ptrdiff_t k = columns->column(name);
    if (k >= 0) check_type(name, columns->column_type(static_cast<std::size_t>(k)), type);
    return k;
  }
  void check_type(std::string_view name, FieldType t, FieldType type) const {
    if (t != type)
      refuse("its field '" + std::string(name) + "' has type " + std::to_string(static_cast<int>(t)) + ", expected " +
             std::to_string(static_cast<int>(type)));
  }
  /// One value per old record in memory of field `name`: `of_field` of its field (V{} where it has none).
  template <class V, class OfField>
  std::vector<V> field_values(std::string_view name, FieldType type, OfField of_field) const {
    std::vector<V> out(old_slots());
    for (std::size_t i = 0; i < out.size(); ++i)
      for (const Field& f : old[i]->fields)
        if (f.name == name) {
          check_type(name, f.type, type);
          out[i] = of_field(f);
          break;
        }
    return out;
  }

  /// A record of this node for new slot `j`, with no fields yet.
  NodeState empty_record(std::size_t j) const {
    NodeState s;
    s.key = node_key();
    s.kind = node_kind();
    s.mode = node_mode();
    s.instance = static_cast<std::uint32_t>(j);
    return s;
  }
};

/// The value of parameter `key` in a node's parameters ("" when it has none).
inline std::string_view param_of(const std::vector<std::pair<std::string, std::string>>& params, std::string_view key) {
  for (const auto& [k, v] : params)
    if (k == key) return v;
  return {};
}
/// The value of parameter `key` of a graph record ("" when it has none).
inline std::string_view param_of(const GraphNodeRecord& n, std::string_view key) { return param_of(n.params, key); }

/// The integer value of parameter `key` of a graph record, or nullopt when it has none or another value
/// ("forever"), for a kind's check_state.
inline std::optional<std::int64_t> int_param_of(const GraphNodeRecord& n, std::string_view key) {
  const std::string_view text = param_of(n, key);
  std::int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || r.ec != std::errc{} || r.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

/// A kind's check_state for a state whose invariant is `S::check(reader, count)` against the node's integer
/// parameter `param`: the record is read into S, and checked when the node has such a parameter.
template <class S>
void check_against_param(const NodeState& record, const GraphNodeRecord& node, std::string_view param) {
  S st;
  StateReader r(record);
  r.read(st);
  if (const auto count = int_param_of(node, param)) st.check(r, static_cast<std::uint64_t>(*count));
}

/// For a kind that keeps one field per worker (`<per_worker>0`, `<per_worker>1`, …) and a u64 `position`
/// naming one of them (merge's cursor, dispatch's next worker): that position is below the worker count the
/// record holds fields for, as a restore checks. A record without the position field passes (a dispatch
/// record of a worker that does not own it).
inline void check_worker_position(const NodeState& record, std::string_view position, std::string_view per_worker) {
  const Field* at = nullptr;
  std::uint64_t workers = 0;
  for (const auto& f : record.fields) {
    if (f.name == position) at = &f;
    else if (f.name.starts_with(per_worker) && f.name.size() > per_worker.size() &&
             std::isdigit(static_cast<unsigned char>(f.name[per_worker.size()])))
      ++workers;
  }
  if (at && at->type == FieldType::u64 && at->u >= workers)
    throw SnapshotError("snapshot state of node '" + record.key + "' (instance " + std::to_string(record.instance) +
                        "): " + std::string(position) + " " + std::to_string(at->u) + " is not one of its " +
                        std::to_string(workers) + " workers");
}

/// What a kind does with its records on a rescale: copy them to every new instance (nothing in them
/// depends on the instance), deal them with a function of the kind's, or refuse with a reason.
class RescaleRule {
 public:
  using Deal = std::vector<NodeState> (*)(const RescaleInput&);

  static RescaleRule replicated() { return RescaleRule(nullptr, {}); }
  static RescaleRule dealt(Deal deal) { return RescaleRule(deal, {}); }
  static RescaleRule refused(std::string reason) { return RescaleRule(nullptr, std::move(reason)); }

  bool refuses() const { return !reason_.empty(); }
  const std::string& reason() const { return reason_; }
  /// The records of the wanted new slots, each with its slot as `instance` (a rule's deal function may
  /// also return a record for every slot, the unwanted ones empty, as RescaleInput::write does).
  std::vector<NodeState> apply(const RescaleInput& in) const {
    if (refuses()) in.refuse(reason_);
    if (deal_) return deal_(in);
    const NodeState first = in.record(0);
    const auto [begin, end] = in.wanted_slots();
    std::vector<NodeState> out(end - begin, first);
    for (std::size_t j = begin; j < end; ++j) out[j - begin].instance = static_cast<std::uint32_t>(j);
    return out;
  }

 private:
  RescaleRule(Deal deal, std::string reason) : deal_(deal), reason_(std::move(reason)) {}
  Deal deal_;
  std::string reason_;
};

namespace rescale {

/// The reason a kind gives when it keeps a position in a stream every instance reads in full.
inline constexpr const char* kReadInFull =
    "it keeps a position in a stream that every instance reads in full, so its instances' states are not "
    "parts of one whole; read it through sampler() to rescale";
/// The reason a kind gives when its state has no rule to be dealt.
inline constexpr const char* kNotDealt =
    "it keeps state that cannot be dealt to another layout; rescalable pipelines read through a sampler and use "
    "shuffle, batch, flat_map and stateless nodes";

/// Pools element lists (in order) and deals them in contiguous runs: of N pooled elements, slot j gets
/// elements [N·j/n, N·(j+1)/n). Slots differ by at most one element, and each takes its elements from as
/// few old lists as it can, so a rescale that reads only what it deals opens few of them. Slots for which
/// `keep(j)` is false are left empty (their share is still counted).
template <class Keep = AllSlots>
std::vector<ElementBlobs> deal(const std::vector<const ElementBlobs*>& lists, std::size_t n, Keep keep = {}) {
  std::vector<ElementBlobs> out(n);
  if (lists.empty()) return out;
  const std::string& tag = lists.front()->tag;
  for (auto& b : out) b.tag = tag;
  std::size_t total = 0;
  for (const ElementBlobs* l : lists) {
    if (l->tag != tag)
      throw SnapshotError("cannot rescale: elements of types " + tag + " and " + l->tag + " in one list");
    total += l->size();
  }
  // The first pooled index of slot j, without overflow (total % n < n, j <= n).
  const auto start = [&](std::size_t j) { return total / n * j + total % n * j / n; };
  std::size_t slot = 0, first = 0;  // first: the pooled index of the current list's element 0
  for (const ElementBlobs* l : lists) {
    const std::size_t len = l->size();
    for (std::size_t k = 0; k < len;) {
      while (first + k >= start(slot + 1)) ++slot;
      const std::size_t stop = std::min(len, start(slot + 1) - first);
      if (keep(slot)) out[slot].append_from(*l, k, stop);
      k = stop;
    }
    first += len;
  }
  return out;
}

}  // namespace rescale

inline std::vector<ElementBlobs> RescaleInput::deal(const std::vector<const ElementBlobs*>& lists,
                                                    std::size_t per_slot) const {
  return rescale::deal(lists, new_slots() * per_slot, [&](std::size_t k) { return wanted(k / per_slot); });
}

template <class Include>
rescale::DealtParts RescaleInput::deal_fields(const std::vector<std::string>& fields, std::size_t per_slot,
                                                    Include include) const {
  for (const auto& f : fields) require_field(f);
  const std::size_t n_old = old_slots(), per_old = fields.size(), parts = new_slots() * per_slot;
  // The pooled index where each (slot, field) list ends, in pool order; and the lists' tag.
  std::vector<std::uint64_t> ends;
  std::vector<std::ptrdiff_t> column_of(per_old, -1);
  std::string tag;
  if (columns)
    for (std::size_t f = 0; f < per_old; ++f) {
      column_of[f] = columns->column(fields[f]);
      if (column_of[f] < 0) continue;
      if (columns->column_type(static_cast<std::size_t>(column_of[f])) != FieldType::elements)
        refuse("its field '" + fields[f] + "' is not a list of elements");
      const std::string& t = columns->tag(static_cast<std::size_t>(column_of[f]));
      if (!tag.empty() && t != tag) throw SnapshotError("cannot rescale: elements of types " + tag + " and " + t + " in one list");
      tag = t;
    }
  const auto field_of = [&](std::size_t i, std::size_t f) -> const Field* {
    for (const Field& x : old[i]->fields)
      if (x.name == fields[f]) return &x;
    return nullptr;
  };
  std::vector<rescale::Numbers> sizes(per_old);  // per field, every slot's list size (columns)
  if (columns)
    for (std::size_t f = 0; f < per_old; ++f)
      if (column_of[f] >= 0) sizes[f] = column_numbers(static_cast<std::size_t>(column_of[f]));
  // One field whose lists all hold one number of elements (a column of one value: full shuffle buffers):
  // where each list ends is computed, with no pass over the old slots.
  std::optional<std::uint64_t> same_size;
  if constexpr (std::is_same_v<Include, rescale::AllSlots>)
    if (columns && per_old == 1 && column_of[0] >= 0) same_size = sizes[0].one_value();
  std::uint64_t total = 0;
  if (same_size) {
    if (*same_size && n_old > (std::uint64_t{1} << 62) / *same_size) refuse("its lists hold more than 2^62 elements together");
    total = n_old * *same_size;
  } else {
    ends.reserve(n_old * per_old);
  }
  for (std::size_t i = 0; i < n_old && !same_size; ++i)
    for (std::size_t f = 0; f < per_old; ++f) {
      if (include(i)) {
        std::uint64_t size = 0;
        if (columns) {
          if (column_of[f] >= 0) size = sizes[f][i];
        } else if (const Field* x = field_of(i, f)) {
          if (!tag.empty() && x->elements.tag != tag)
            throw SnapshotError("cannot rescale: elements of types " + tag + " and " + x->elements.tag + " in one list");
          tag = x->elements.tag;
          size = x->elements.size();
        }
        if (size > (std::uint64_t{1} << 62) - total) refuse("its lists hold more than 2^62 elements together");
        total += size;
      }
      ends.push_back(total);
    }
  const auto [first_slot, end_slot] = wanted_slots();
  const std::size_t first = first_slot * per_slot, held = (end_slot - first_slot) * per_slot;
  std::vector<ElementBlobs> out(held);
  for (auto& b : out) b.tag = tag;
  const auto end_of = [&](std::size_t idx) { return same_size ? std::uint64_t(idx + 1) * *same_size : ends[idx]; };
  // Part p takes pooled elements [start(p), start(p + 1)) (as rescale::deal), read from the lists they lie in.
  const auto start = [&](std::size_t p) { return total / parts * p + total % parts * p / parts; };
  for (std::size_t p = first; p < first + held; ++p) {
    std::uint64_t at = start(p);
    const std::uint64_t end = start(p + 1);
    auto idx = same_size ? static_cast<std::size_t>(*same_size ? at / *same_size : 0)
                         : static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), at) - ends.begin());
    for (; at < end; ++idx) {
      const std::uint64_t list_begin = idx ? end_of(idx - 1) : 0, take_end = std::min(end, end_of(idx));
      if (take_end <= at) continue;
      const std::size_t i = idx / per_old, f = idx % per_old;
      const auto begin = static_cast<std::size_t>(at - list_begin), stop = static_cast<std::size_t>(take_end - list_begin);
      if (columns) out[p - first].append_from(columns->list(i, static_cast<std::size_t>(column_of[f])), begin, stop);
      else out[p - first].append_from(field_of(i, f)->elements, begin, stop);
      at = take_end;
    }
  }
  return rescale::DealtParts(parts, first, std::move(out), tag);
}

}  // namespace dpipe
