// `backplane bench --generate`: a GPT-style decoder's prompt and generated
// tokens per second (bench_generate.cpp).
#pragma once

#include "commands.hpp"

#include <string>

namespace backplane::cli {

int bench_generate(Args& args, const std::string& device_name, int threads, bool json);

// The `stream` roof (cmd_bench.cpp): seconds of c = a + b over 16M floats.
double stream_add_seconds(unsigned threads, double min_time);

}  // namespace backplane::cli
