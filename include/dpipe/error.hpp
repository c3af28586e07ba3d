#pragma once
/// dpipe's exceptions. Messages are full sentences that name the node and the values that matter.
#include <cstdint>
#include <exception>
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

/// A file cannot be written, or its path names what dpipe never replaces (a directory, a device, a
/// FIFO); see atomic_file.hpp. The message names the path and the reason.
class FileError : public Error {
 public:
  using Error::Error;
};

/// A user function threw. The original exception is nested (std::rethrow_if_nested). The message names the
/// node by its label (Graph::labels: "pipeline[3] (map 'tok')"); node_key() is its key in snapshots.
class NodeError : public Error, public std::nested_exception {
 public:
  NodeError(std::string node_key, const std::string& label, int worker, const std::string& cause)
      : Error((label.empty() ? "node '" + node_key + "'" : label) + " failed (worker " + std::to_string(worker) +
              "): " + cause),
        node_key_(std::move(node_key)),
        label_(label.empty() ? "node '" + node_key_ + "'" : label),
        worker_(worker),
        cause_(cause) {}
  NodeError(std::string node_key, int worker, const std::string& cause)
      : NodeError(std::move(node_key), std::string(), worker, cause) {}
  const std::string& node_key() const { return node_key_; }
  /// How the message names the node: "pipeline[3] (map 'tok')".
  const std::string& label() const { return label_; }
  int worker() const { return worker_; }
  /// The original exception's message.
  const std::string& cause() const { return cause_; }

 private:
  std::string node_key_;
  std::string label_;
  int worker_;
  std::string cause_;
};

/// A failure as a snapshot records it: a worker that failed ahead of the consumer has a chain that is
/// past the failure, so the failure itself is saved and raised again at the same point on restore.
struct FailureRecord {
  std::string cause{};  // empty: no failure
  std::string node{};
  std::int64_t worker = -1;

  static FailureRecord of(const std::exception_ptr& e) {
    FailureRecord f;
    if (!e) return f;
    try {
      std::rethrow_exception(e);
    } catch (const NodeError& ne) {
      f = {ne.cause(), ne.node_key(), ne.worker()};
    } catch (const std::exception& ex) {
      f.cause = ex.what();
    } catch (...) {
      f.cause = "unknown exception";
    }
    if (f.cause.empty()) f.cause = "unknown failure";
    return f;
  }
  /// The failure as a NodeError. The original exception did not survive the snapshot, so the one
  /// nested in it is a std::runtime_error carrying the original's message (never an empty nest, which
  /// would make std::rethrow_if_nested terminate the process).
  /// `label`: how messages name the node (Graph::label_of), empty for its key.
  std::exception_ptr to_exception(const std::string& label = {}) const {
    if (cause.empty()) return nullptr;
    try {
      throw std::runtime_error(cause);
    } catch (...) {
      return std::make_exception_ptr(NodeError(node, label, static_cast<int>(worker), cause));
    }
  }
};

}  // namespace dpipe
