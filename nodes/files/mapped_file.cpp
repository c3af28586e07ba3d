// The memory maps of data files (dpipe/detail/mapped_file.hpp), with the SIGBUS handler that turns a file
// shrinking under a map into a DataError.
#include "dpipe/detail/mapped_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "dpipe/error.hpp"
#include "dpipe/regular_file.hpp"

namespace dpipe::detail {

namespace {

struct sigaction g_previous_bus_action;  // what SIGBUS did before the handler below
std::uintptr_t g_page_size = 4096;  // the system's, from the first map on
// Initial-exec: guards are made per element, and the handler reads this without calls (a program that
// dlopens libdpipe needs the C library's static TLS surplus for it: one pointer).
[[gnu::tls_model("initial-exec")]] thread_local const MappedReadGuard* t_innermost_guard = nullptr;

}  // namespace

/// The SIGBUS handler (installed once, by the first map). Only async-signal-safe calls in here (mmap
/// is not on POSIX's list, but on Linux it is a plain system call).
struct MappedFaultHandler {
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

  static void install() {
    static std::once_flag once;
    std::call_once(once, [] {
      g_page_size = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
      ::sigaction(SIGBUS, nullptr, &g_previous_bus_action);  // saved before the new handler can run
      struct sigaction action {};
      action.sa_sigaction = &on_bus;
      action.sa_flags = SA_SIGINFO | SA_ONSTACK;  // an alternate stack, where a runtime set one up
      sigemptyset(&action.sa_mask);
      ::sigaction(SIGBUS, &action, nullptr);
    });
  }

  static void on_bus(int sig, siginfo_t* info, void* context) {
    const int saved_errno = errno;
    const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    // Only a nonexistent physical address (a page past the file's end); not a hardware memory error.
    for (const MappedReadGuard* g = t_innermost_guard; g && info->si_code == BUS_ADRERR; g = g->outer_) {
      const MappedFile& f = g->file_;
      const auto begin = reinterpret_cast<std::uintptr_t>(f.data_);
      if (!f.data_ || addr < begin || addr >= begin + f.size_) continue;
      // The file shrank under its map. Note it first (another thread that then reads the zero pages
      // sees the note when it checks), keeping the lowest offset seen, then put zero pages over the rest
      // of the map (which starts page-aligned) and let the read run again.
      const std::uint64_t offset = addr - begin;
      std::uint64_t seen = f.lost_from_.load();
      while (offset < seen && !f.lost_from_.compare_exchange_weak(seen, offset)) {
      }
      const std::uintptr_t from = addr / g_page_size * g_page_size;
      const std::uintptr_t to = (begin + f.size_ + g_page_size - 1) / g_page_size * g_page_size;
      if (::mmap(reinterpret_cast<void*>(from), to - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
          MAP_FAILED) {
        errno = saved_errno;
        return;
      }
      break;
    }
    // Not a guarded read: whatever SIGBUS did before.
    const struct sigaction& before = g_previous_bus_action;
    if (before.sa_flags & SA_SIGINFO) {
      before.sa_sigaction(sig, info, context);
    } else if (before.sa_handler == SIG_IGN) {
      // Ignored before: a SIGBUS sent by a process stays ignored; a fault cannot be (the kernel ends the
      // process when it recurs with the default action).
      if (info->si_code > 0) ::signal(SIGBUS, SIG_DFL);
    } else if (before.sa_handler != SIG_DFL) {
      before.sa_handler(sig);
    } else {
      // The default action, which ends the process. A fault recurs when this returns, and the kernel then
      // ends the process with the fault's own address and code; a signal sent by a process is raised again.
      ::signal(SIGBUS, SIG_DFL);
      if (info->si_code <= 0) ::raise(SIGBUS);
    }
    errno = saved_errno;
  }
};

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  MappedFaultHandler::install();
  // A regular file only (never blocks on a FIFO); its descriptor is closed once the file is mapped.
  const RegularFile file(path_, FileRole::data);
  size_ = static_cast<std::size_t>(file.size());
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (p == MAP_FAILED) throw DataError("cannot map data file '" + path_ + "': " + std::strerror(errno));
    data_ = static_cast<const char*>(p);
  }
}

void MappedFile::will_read(std::size_t begin, std::size_t end) const {
#ifdef MADV_POPULATE_READ
  end = std::min(end, size_);
  if (!data_ || begin >= end) return;
  const std::size_t from = begin / g_page_size * g_page_size;  // read once, by the first map
  ::madvise(const_cast<char*>(data_) + from, end - from, MADV_POPULATE_READ);  // a hint: errors ignored
#else
  (void)begin;
  (void)end;
#endif
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

// The signal fences keep the compiler from moving the guarded reads out of the guard's lifetime, and
// the store of t_innermost_guard from being dropped as dead (the handler reads it).
MappedReadGuard::MappedReadGuard(const MappedFile& file) : file_(file), outer_(t_innermost_guard) {
  t_innermost_guard = this;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

MappedReadGuard::~MappedReadGuard() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_innermost_guard = outer_;
}

void MappedReadGuard::check_size() const {
  check();
  std::error_code ec;
  const auto now = std::filesystem::file_size(file_.path(), ec);
  if (ec || now < file_.size()) {
    std::uint64_t intact = MappedFile::kIntact;
    file_.lost_from_.compare_exchange_strong(intact, ec ? 0 : now);
    fail();
  }
}

void MappedReadGuard::fail() const {
  std::error_code ec;
  const auto now = std::filesystem::file_size(file_.path(), ec);
  throw DataError("data file '" + file_.path() + "' shrank while it was read: it was " + std::to_string(file_.size()) +
                  " bytes when mapped, " + (ec ? "and cannot be read now" : "and is " + std::to_string(now) + " now") +
                  " (byte offset " + std::to_string(file_.lost_from_.load()) + " is gone)");
}

}  // namespace dpipe::detail
