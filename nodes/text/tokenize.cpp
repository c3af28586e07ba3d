// tokenize's SentencePiece model: loading, the identity the fingerprint holds, encoding.
#include "dpipe/nodes/tokenize.hpp"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <fstream>
#include <iterator>

namespace dpipe {

namespace detail {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceModel::~SentencePieceModel() = default;

std::shared_ptr<const SentencePieceModel> SentencePieceModel::load(const std::string& path, const std::string& node) {
  if (path.empty()) throw ConfigError(node + ": model must name a SentencePiece model file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(node + ": cannot open the model file '" + path + "'");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw ConfigError(node + ": cannot read the model file '" + path + "'");
  std::shared_ptr<SentencePieceModel> m(new SentencePieceModel());
  m->impl_ = std::make_unique<Impl>();
  if (const auto status = m->impl_->processor.LoadFromSerializedProto(bytes); !status.ok())
    throw ConfigError(node + ": '" + path + "' is not a SentencePiece model (" + status.ToString() + ")");
  // FNV-1a over the bytes: a 64-bit identity of the model that does not depend on where it lies.
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  m->identity_ = std::string("digest ") + hex + " (" + std::to_string(bytes.size()) + " bytes)";
  return m;
}

std::string SentencePieceModel::encode(std::string_view text, std::vector<int>& out) const {
  thread_local std::vector<int> ids;
  ids.clear();
  if (const auto status = impl_->processor.Encode(text, &ids); !status.ok()) return "SentencePiece: " + status.ToString();
  out.insert(out.end(), ids.begin(), ids.end());
  return {};
}

int SentencePieceModel::bos_id() const { return impl_->processor.bos_id(); }
int SentencePieceModel::eos_id() const { return impl_->processor.eos_id(); }
int SentencePieceModel::vocab_size() const { return impl_->processor.GetPieceSize(); }

}  // namespace detail

Params TokenizeKind::checked_params(const TokenizeOptions& o) {
  const std::string node = node_label("tokenize", o.name);
  if (!o.loaded) throw ConfigError(node + ": the model is not loaded (build the node with tokenize())");
  if (o.field.empty() || o.into.empty()) throw ConfigError(node + ": field and into must name fields");
  if (o.bos && o.loaded->bos_id() < 0) throw ConfigError(node + ": bos is asked for, but the model has no BOS piece");
  if (o.eos && o.loaded->eos_id() < 0) throw ConfigError(node + ": eos is asked for, but the model has no EOS piece");
  return {{"model", o.loaded->identity()}, {"field", o.field},          {"into", o.into},
          {"bos", param_text(o.bos)},      {"eos", param_text(o.eos)}, {"on_error", on_error_text(o.on_error)}};
}

}  // namespace dpipe
