#pragma once
/// dpipe's exceptions. Messages are full sentences that name the node and the values that matter.
#include <stdexcept>
#include <string>

namespace dpipe {

/// Base of every error dpipe throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A pipeline or option is invalid; raised when the pipeline is built or a Run is started.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A snapshot cannot be read, or does not belong to this pipeline, seed or layout.
class SnapshotError : public Error {
 public:
  using Error::Error;
};

/// Input data is malformed (file, offset and what was wrong).
class DataError : public Error {
 public:
  using Error::Error;
};

/// A user function threw. The original exception is nested (std::rethrow_if_nested).
class NodeError : public Error, public std::nested_exception {
 public:
  NodeError(std::string node_key, int worker, const std::string& what)
      : Error("node '" + node_key + "' (worker " + std::to_string(worker) + ") failed: " + what),
        node_key_(std::move(node_key)),
        worker_(worker) {}
  const std::string& node_key() const { return node_key_; }
  int worker() const { return worker_; }

 private:
  std::string node_key_;
  int worker_;
};

}  // namespace dpipe
