// fuzz_replay: runs fuzz inputs through the harness functions without
// libFuzzer, in any build (the ctest `fuzz_corpus_replay` runs the checked-in
// corpora this way, also under ASan/UBSan).
//
//   fuzz_replay [--plugin-dirs DIRS] [--verbose] [--no-fork] PATH...
//
// A PATH that is a folder with subfolders named after harnesses
// (fuzz/corpus: fuzz_graph/, fuzz_npy/, ...) has each file of each subfolder
// run through every harness: the inputs of one are hostile inputs to the
// others too. Any other folder or file is run through every harness as well.
// Each run happens in a child process, so that a crash is reported as a
// finding and the other inputs still run (--no-fork: all in this process,
// for a debugger). --verbose prints what each harness did with each input.
// Exit status 1 when a harness reports a finding; a crash or a sanitizer
// report ends the process (the file being run is printed first).
#include "harness.hpp"

#include <backplane/backplane.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

// ---- One allocation above 256 MiB is a finding ------------------------------
// Inputs are at most 64 KiB; a single allocation above 256 MiB made from one
// is unbounded amplification (a few bytes of JSON asking for gigabytes).
// libFuzzer catches it with -malloc_limit_mb=256 (scripts/fuzz.sh); here the
// replaceable allocation functions refuse it (std::bad_alloc, which the core
// turns into an Error) and remember it, so the replay reports it without
// allocating anything. Every non-aligned form is replaced, so that under
// ASan new and delete stay paired (malloc/free underneath).
namespace {
constexpr size_t kMaxAllocation = size_t{256} << 20;
std::atomic<size_t> g_refused{0};  // the size of the last refused allocation

void* allocate(size_t n) {
  if (n > kMaxAllocation) {
    g_refused = n;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t n) { return allocate(n); }
void* operator new[](size_t n) { return allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using Harness = int (*)(const uint8_t*, size_t);
struct Named {
  const char* name;
  Harness fn;
};
const Named kHarnesses[] = {
    {"fuzz_graph", backplane::fuzz::graph_one},
    {"fuzz_npy", backplane::fuzz::npy_one},
    {"fuzz_manifest", backplane::fuzz::manifest_one},
    {"fuzz_plan", backplane::fuzz::plan_one},
#ifdef BACKPLANE_HAVE_REMOTE
    {"fuzz_remote", backplane::fuzz::remote_one},
    {"fuzz_session", backplane::fuzz::session_one},
#endif
#ifdef BACKPLANE_HAVE_ONNX
    {"fuzz_onnx", backplane::fuzz::onnx_one},
#endif
};

std::vector<std::filesystem::path> files_under(const std::filesystem::path& p) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(p)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(p))
      if (e.is_regular_file()) out.push_back(e.path());
  } else {
    out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One harness on one input: 1 when it reports a finding (printed), else 0.
int run_one(const Named& h, const std::filesystem::path& file, const std::string& bytes, bool verbose) {
  g_refused = 0;
  try {
    h.fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (verbose) std::fprintf(stderr, "  %s\n", backplane::fuzz::last_note().c_str());
    if (const size_t n = g_refused.exchange(0)) {
      std::fprintf(stderr, "FINDING %s %s: a single allocation of %zu bytes from a %zu-byte input (the limit is 256 MiB)\n",
                   h.name, file.c_str(), n, bytes.size());
      return 1;
    }
    return 0;
  } catch (const backplane::fuzz::HarnessFailure& e) {
    std::fprintf(stderr, "FINDING %s %s: %s\n", h.name, file.c_str(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FINDING %s %s: an exception other than backplane::Error escaped: %s\n", h.name, file.c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "FINDING %s %s: a non-standard exception escaped\n", h.name, file.c_str());
  }
  return 1;
}

// The same in a child process: a crash or a sanitizer report is a finding too.
// The child exits 0, or kFindingExit when it printed a finding itself.
constexpr int kFindingExit = 97;
int run_isolated(const Named& h, const std::filesystem::path& file, const std::string& bytes, bool verbose) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "fuzz_replay: fork failed: %s\n", std::strerror(errno));
    std::exit(2);
  }
  if (pid == 0) {
    const int r = run_one(h, file, bytes, verbose);
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(r ? kFindingExit : 0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    std::fprintf(stderr, "FINDING %s %s: the process died of signal %d (%s)\n", h.name, file.c_str(), WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    return 1;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == kFindingExit))  // a sanitizer's report, above
    std::fprintf(stderr, "FINDING %s %s: the process exited with status %d (a sanitizer report?)\n", h.name, file.c_str(),
                 WEXITSTATUS(status));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> paths;
  bool verbose = false, isolate = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--plugin-dirs" && i + 1 < argc) {
      backplane::fuzz::set_plugin_dirs(argv[++i]);
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--no-fork") {
      isolate = false;
    } else if (a == "-h" || a == "--help") {
      std::cout << "usage: fuzz_replay [--plugin-dirs DIRS] [--verbose] [--no-fork] PATH...\n";
      return 0;
    } else {
      paths.emplace_back(a);
    }
  }
  if (paths.empty()) {
    std::cerr << "usage: fuzz_replay [--plugin-dirs DIRS] [--verbose] [--no-fork] PATH...\n";
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& p : paths) {
    if (!std::filesystem::exists(p)) {
      std::cerr << "fuzz_replay: " << p.string() << " does not exist\n";
      return 2;
    }
    const auto f = files_under(p);
    files.insert(files.end(), f.begin(), f.end());
  }
  backplane::fuzz::prepare();  // one scratch folder, shared by the children, removed at exit
  size_t runs = 0, findings = 0;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::cerr << "fuzz_replay: cannot read " << file.string() << "\n";
      return 2;
    }
    for (const auto& h : kHarnesses) {
      // Printed before the run, so a crash names its input.
      if (verbose || !isolate) std::fprintf(stderr, "%s %s\n", h.name, file.c_str());
      ++runs;
      findings += static_cast<size_t>(isolate ? run_isolated(h, file, bytes, verbose) : run_one(h, file, bytes, verbose));
    }
  }
  std::printf("fuzz_replay: %zu files, %zu harness runs, %zu findings\n", files.size(), runs, findings);
  return findings ? 1 : 0;
}
