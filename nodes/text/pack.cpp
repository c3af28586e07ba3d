// pack: placing documents into rows, the rows as records, the state's invariants and the rescale rule.
#include "dpipe/nodes/pack.hpp"

#include <algorithm>
#include <cstring>

namespace dpipe {

Params PackKind::checked_params(const PackOptions& o) {
  const std::string node = node_label("pack", o.name);
  if (o.seq_len <= 0) throw ConfigError(node + ": seq_len must be positive, got " + param_text(o.seq_len));
  // Each row holds three int64 arrays of seq_len, made before a document fills them.
  if (o.seq_len > (std::int64_t{1} << 24)) throw ConfigError(node + ": seq_len must be at most 2^24, got " + param_text(o.seq_len));
  if (o.buffer <= 0) throw ConfigError(node + ": buffer must be positive, got " + param_text(o.buffer));
  if (o.field.empty()) throw ConfigError(node + ": field must name a field");
  Params p{{"seq_len", param_text(o.seq_len)}, {"field", o.field},
           {"mode", o.mode == PackMode::greedy ? "greedy" : "first_fit"}};
  if (o.mode == PackMode::first_fit) p.emplace_back("buffer", param_text(o.buffer));
  return p;
}

namespace detail {

Packer::Packer(const PackOptions& o, bool traced)
    : seq_len_(static_cast<std::size_t>(o.seq_len)), field_(o.field), mode_(o.mode),
      buffer_(o.mode == PackMode::greedy ? 1 : static_cast<std::size_t>(o.buffer)), traced_(traced) {}

void Packer::place(Row& row, const char* t, std::size_t n, std::int64_t position, const Value* doc,
                   const Provenance& trace) const {
  const std::int64_t segment = ++row.segments;
  if (row.tokens.capacity() < seq_len_ * 8) {
    row.tokens.reserve(seq_len_ * 8);
    row.segment_ids.reserve(seq_len_ * 8);
    row.positions.reserve(seq_len_ * 8);
  }
  row.tokens.append(t, n * 8);
  const std::size_t at = row.len * 8;
  row.segment_ids.resize(at + n * 8);
  row.positions.resize(at + n * 8);
  char* s = row.segment_ids.data() + at;
  char* p = row.positions.data() + at;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t pos = position + static_cast<std::int64_t>(i);
    std::memcpy(s + 8 * i, &segment, 8);
    std::memcpy(p + 8 * i, &pos, 8);
  }
  row.len += n;
  row.docs.push_back(doc ? *doc : Value::none());
  row.any_doc = row.any_doc || doc;
  if (!traced_) return;
  if (trace.size() != 1 || !is_known(trace) || trace[0].sliced()) {  // not a document of one base element
    row.trace.push_back(unknown_provenance()[0]);
    return;
  }
  SourcePos piece = trace[0];
  piece.begin = static_cast<std::uint64_t>(position);
  piece.end = piece.begin + n;
  row.trace.push_back(std::move(piece));
}

Value Packer::row_value(Row row, bool pad) const {
  const std::size_t len = pad ? seq_len_ : row.len;
  Value out = make_record(4);
  auto column = [&](std::string& bytes) {
    bytes.resize(len * 8);  // the rest is 0: padding
    return Value::array(ValueArray{.dtype = "<i8", .shape = {len}, .data = std::move(bytes)});
  };
  set_field(out, "tokens", column(row.tokens));
  set_field(out, "segment_ids", column(row.segment_ids));
  set_field(out, "positions", column(row.positions));
  if (row.any_doc) set_field(out, "doc", Value::list(std::move(row.docs)));
  return out;
}

void Packer::emit(Row&& row) {
  if (traced_) ready_traces_.push_back(std::move(row.trace));
  ready_.push_back(row_value(std::move(row), true));
}

std::string Packer::tokens_of(const Value& document, const char*& t, std::size_t& n, std::vector<std::int64_t>& scratch) const {
  const Value* tokens = find_field(document, field_);
  if (!tokens) return is_record(document) ? "a document has no field '" + field_ + "'" : "an element is not a record";
  // The tokens' bytes as int64s: the array's own when it is one of int64, else converted.
  if (const auto* a = tokens->kind == Value::Kind::array ? &tokens->as_array() : nullptr;
      a && a->dtype == "<i8" && a->shape.size() == 1 && a->data.size() == a->shape[0] * 8) {
    t = a->data.data();
    n = a->shape[0];
  } else if (read_int64s(*tokens, scratch)) {
    t = reinterpret_cast<const char*>(scratch.data());
    n = scratch.size();
  } else {
    return "field '" + field_ + "' of a document is not a 1-D array (or list) of integers";
  }
  return {};
}

std::string Packer::add(const Value& document, const Provenance& trace) {
  const char* t = nullptr;
  std::size_t n = 0;
  if (std::string why = tokens_of(document, t, n, tokens_); !why.empty()) return why;
  const Value* doc = find_field(document, "doc");
  std::size_t at = 0;
  if (mode_ == PackMode::greedy) {
    while (at < n) {
      if (open_.empty()) open_.emplace_back();
      Row& row = open_.back();
      const std::size_t take = std::min(seq_len_ - row.len, n - at);
      place(row, t + 8 * at, take, static_cast<std::int64_t>(at), doc, trace);
      at += take;
      if (row.len == seq_len_) {
        emit(std::move(row));
        open_.pop_back();
      }
    }
    return {};
  }
  // first_fit: whole rows of the document first, each a row of its own.
  for (; n - at >= seq_len_; at += seq_len_) {
    Row row;
    place(row, t + 8 * at, seq_len_, static_cast<std::int64_t>(at), doc, trace);
    emit(std::move(row));
  }
  const std::size_t rest = n - at;
  if (rest == 0) return {};
  auto fits = std::find_if(open_.begin(), open_.end(), [&](const Row& r) { return seq_len_ - r.len >= rest; });
  if (fits == open_.end()) {
    while (open_.size() >= buffer_) {
      emit(std::move(open_.front()));
      open_.pop_front();
    }
    open_.emplace_back();
    fits = open_.end() - 1;
  }
  place(*fits, t + 8 * at, rest, static_cast<std::int64_t>(at), doc, trace);
  if (fits->len == seq_len_) {
    emit(std::move(*fits));
    open_.erase(fits);
  }
  return {};
}

void Packer::finish() {
  for (Row& row : open_) emit(std::move(row));
  open_.clear();
}

std::size_t Packer::take(std::vector<Value>& out, std::size_t max, std::vector<Provenance>* traces) {
  std::size_t n = 0;
  for (; n < max && !ready_.empty(); ++n) {
    out.push_back(std::move(ready_.front()));
    ready_.pop_front();
    if (!traced_) continue;
    if (traces) traces->push_back(std::move(ready_traces_.front()));
    ready_traces_.pop_front();
  }
  return n;
}

std::pair<std::vector<Provenance>, std::vector<Provenance>> Packer::traces() const {
  std::vector<Provenance> open;
  for (const Row& row : open_) open.push_back(row.trace);
  return {std::move(open), {ready_traces_.begin(), ready_traces_.end()}};
}

Value Packer::rebuild(const Provenance& p, bool pad, const std::function<Value(const Provenance&)>& document,
                      const std::string& who) const {
  auto refuse = [&](const std::string& why) -> Value {
    throw SnapshotError(who + ": a restore key names no row of this node (" + to_string(p) + "): " + why);
  };
  if (p.empty()) return refuse("it has no segment");
  Row row;
  std::vector<std::int64_t> scratch;
  for (const SourcePos& s : p) {
    if (!s.sliced()) return refuse("a segment without its token range");
    if (row.len + (s.end - s.begin) > seq_len_) return refuse("its segments hold more than seq_len tokens");
    SourcePos whole = s;
    whole.begin = whole.end = 0;
    const Provenance doc_trace{whole};
    const Value d = document(doc_trace);
    const char* t = nullptr;
    std::size_t n = 0;
    if (std::string why = tokens_of(d, t, n, scratch); !why.empty()) return refuse(why);
    if (s.end > n) return refuse("its document has " + std::to_string(n) + " tokens");
    place(row, t + 8 * s.begin, s.end - s.begin, static_cast<std::int64_t>(s.begin), find_field(d, "doc"), doc_trace);
  }
  if (!pad && row.len >= seq_len_) return refuse("an open row holds fewer than seq_len tokens");
  return row_value(std::move(row), pad);
}

PackState<std::vector<Value>> Packer::state(bool input_done) const {
  PackState<std::vector<Value>> st;
  st.input_done = input_done;
  for (const Row& row : open_) st.open.push_back(row_value(row, false));  // a copy: the row stays open
  st.ready.assign(ready_.begin(), ready_.end());
  return st;
}

namespace {
// One column of a saved row: an int64 array of `len` items, or null.
const std::string* column(const Value& row, const char* name) {
  const Value* v = find_field(row, name);
  if (!v || v->kind != Value::Kind::array) return nullptr;
  const auto& a = v->as_array();
  if (a.dtype != "<i8" || a.shape.size() != 1 || a.data.size() != a.shape[0] * 8) return nullptr;
  return &a.data;
}
}  // namespace

void Packer::restore(PackState<std::vector<Value>> st, const StateReader& r, std::vector<Provenance> open_traces,
                     std::vector<Provenance> ready_traces) {
  open_.clear();
  ready_.clear();
  ready_traces_.clear();
  if (traced_) {  // rows saved as data have no known provenance
    open_traces.resize(st.open.size(), unknown_provenance());
    ready_traces.resize(st.ready.size(), unknown_provenance());
  }
  auto check = [&](const Value& v, const char* list, std::size_t i, bool full) {
    const std::string what = std::string(list) + " row " + std::to_string(i);
    const std::string *t = column(v, "tokens"), *s = column(v, "segment_ids"), *p = column(v, "positions");
    if (!t || !s || !p) r.fail(what + " is not a record of int64 arrays tokens, segment_ids and positions");
    if (t->size() != s->size() || t->size() != p->size()) r.fail(what + "'s columns differ in length");
    const std::size_t len = t->size() / 8;
    if (full ? len != seq_len_ : (len == 0 || len >= seq_len_))
      r.fail(what + " holds " + std::to_string(len) + " tokens; " + (full ? "a made row holds seq_len " : "an open row holds 1 to seq_len - 1, seq_len ") +
             std::to_string(seq_len_));
    return len;
  };
  for (std::size_t i = 0; i < st.open.size(); ++i) {
    const Value& v = st.open[i];
    const std::size_t len = check(v, "open", i, false);
    Row row;
    row.tokens = *column(v, "tokens");
    row.segment_ids = *column(v, "segment_ids");
    row.positions = *column(v, "positions");
    row.len = len;
    std::vector<std::int64_t> ids(len);
    std::memcpy(ids.data(), row.segment_ids.data(), len * 8);
    for (std::size_t k = 0; k < len; ++k)
      if (ids[k] < 1 || (k > 0 && ids[k] != ids[k - 1] && ids[k] != ids[k - 1] + 1) || (k == 0 && ids[k] != 1))
        r.fail("open row " + std::to_string(i) + "'s segment ids do not count 1, 2, … in order");
    row.segments = ids.back();
    if (const Value* d = find_field(v, "doc")) {
      if (d->kind != Value::Kind::list || std::get<std::vector<Value>>(d->data).size() != static_cast<std::size_t>(row.segments))
        r.fail("open row " + std::to_string(i) + "'s doc is not a list of one value per segment");
      row.docs = std::get<std::vector<Value>>(d->data);
      row.any_doc = true;
    } else {
      row.docs.assign(static_cast<std::size_t>(row.segments), Value::none());
    }
    if (traced_) row.trace = std::move(open_traces[i]);
    open_.push_back(std::move(row));
  }
  for (std::size_t i = 0; i < st.ready.size(); ++i) check(st.ready[i], "ready", i, true);
  ready_.assign(std::make_move_iterator(st.ready.begin()), std::make_move_iterator(st.ready.end()));
  if (traced_) ready_traces_.assign(std::make_move_iterator(ready_traces.begin()), std::make_move_iterator(ready_traces.end()));
  // A rescale may deal more open rows than the mode keeps: the first ones are made now, padded.
  while (open_.size() > buffer_) {
    emit(std::move(open_.front()));
    open_.pop_front();
  }
  if (st.input_done) finish();
}

}  // namespace detail

RescaleRule PackKind::rescale() {
  return RescaleRule::dealt([](const RescaleInput& in) {
    using S = PackState<ElementBlobs>;
    in.check_fields<S>();
    const auto open = in.deal(&S::open);
    const auto ready = in.deal(&S::ready);
    return in.write_slots([&](std::size_t j) { return S{.open = open[j], .ready = ready[j], .input_done = false}; });
  });
}

std::string PackKind::summary(const NodeState& record, const GraphNodeRecord&) {
  PackState<ElementBlobs> st;
  StateReader r(record);
  r.read(st);
  return std::to_string(st.open.size()) + " open rows, " + std::to_string(st.ready.size()) + " rows made and not taken" +
         (st.input_done ? ", its input ended" : "");
}

}  // namespace dpipe
