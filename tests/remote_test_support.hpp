// Requests the remote tests build by hand (tests/test_remote.cpp,
// tests/test_server_abuse.cpp).
#pragma once

#include "backplane_remote.grpc.pb.h"

#include <backplane/abi.h>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace backplane::remotetest {

// A new private directory under the system's temporary one.
// Environment variables set for the scope of a test (unset when it ends).
struct Env {
  std::vector<std::string> names;
  void set(const std::string& n, const std::string& v) {
    setenv(n.c_str(), v.c_str(), 1);
    names.push_back(n);
  }
  ~Env() {
    for (auto& n : names) unsetenv(n.c_str());
  }
};

inline std::string make_temp_dir(const std::string& prefix) {
  std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

// Starts args[0] with `args`, its stdout and stderr into the file `log`;
// `in_child` runs in the child just before exec (limits, environment).
// The child's pid.
inline pid_t spawn_logged(std::vector<std::string> args, const std::string& log,
                          const std::function<void()>& in_child = {}) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    if (in_child) in_child();
    execv(argv[0], argv.data());
    _exit(127);
  }
  REQUIRE(pid > 0);
  return pid;
}

// out = a + a on a [2, 3] f32 view of buffer `buf` (in place), with the
// server's f32 add at kernel index `kernel`.
inline remote::Call add_call(uint32_t kernel, uint64_t buf) {
  remote::Call call;
  call.set_kernel(kernel);
  for (int i = 0; i < 3; ++i) {
    auto* s = i < 2 ? call.add_inputs() : call.add_outputs();
    s->set_buffer(buf);
    s->set_byte_size(24);
    s->set_dtype(BP_DTYPE_F32);
  }
  for (int i = 0; i < 3; ++i) {
    auto* l = call.add_layouts();
    l->add_shape(2);
    l->add_shape(3);
    l->add_strides(3);
    l->add_strides(1);
  }
  call.mutable_params()->set_kind(BP_PARAMS_NONE);
  return call;
}

}  // namespace backplane::remotetest
