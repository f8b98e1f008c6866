// scaled_dot_product_attention as a built-in fused op: its composed form is
// both the pattern the optimizer looks for and what runs on devices that
// lack the op.
//
// fuse_attention (an optimizer pass, before the vendor patterns): the
// exported form
//
//     s = matmul(q, kt)            kt: k with its last two dims swapped (a view),
//                                  or any [..., D, Sk] value (then k is its
//                                  transpose, a view)
//     s = s * c | s / c | affine(s, mul, add=0)   optional; c a one-element
//                                  constant
//     s = s + mask                 optional, either operand order
//     p = softmax(s, dim=-1)
//     y = matmul(p, v)
//
// becomes one node y = scaled_dot_product_attention(q, k, v, mask) when the
// device the node would run on by default (the list's first) has the op's
// kernel for the dtype, no intermediate is used elsewhere (another node, a
// graph output, a kept value), nothing is pinned, and the op's inference
// gives y's type (same batch dims for q, k, v). The fused kernel rounds
// differently from the composed ops: it is checked against the composed f64
// reference within the Compound class (docs/ops.md). Every fusion and every
// refused near miss is a note for --explain.
//
// expand_attention (always, before any pass): a scaled_dot_product_attention
// node for which no device of the list has a kernel of its dtype becomes the
// composed form above (the causal limit as a constant additive mask of
// [Sq, Sk]), so any device with matmul and softmax runs it.
#pragma once

#include <backplane/backplane.hpp>

#include <optional>
#include <string>
#include <vector>

namespace backplane::detail {

struct AttentionResult {
  Graph graph;
  std::vector<std::string> notes;  // for explain()
  int changed = 0;
};

// On a device of kind "cpu" only from cpu_min_score_bytes of f32 scores on
// (RuntimeOptions::attention_cpu_min_bytes). Measured on 2 threads, fused /
// composed time: [4, 128, 128] scores 1.11, [8, 256, 256] 1.08, [8, 512, 512]
// 0.90, [8, 2048, 2048] 0.83, hence the default of 4 MiB.
std::optional<AttentionResult> fuse_attention(const Graph& graph, const std::vector<Device*>& devices,
                                              const std::vector<std::string>& keep, uint64_t cpu_min_score_bytes);

std::optional<AttentionResult> expand_attention(const Graph& graph, const std::vector<Device*>& devices);

}  // namespace backplane::detail
