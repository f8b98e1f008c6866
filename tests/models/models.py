"""The model set: real architectures with random weights (nothing is
downloaded), each as (module, example inputs). torchvision's classifiers and
two hand-written transformers: an encoder (GELU, LayerNorm, attention) and a
GPT-style decoder with causal attention over token ids.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _randomize_batch_norms(module, gen):
    # Fresh BatchNorm statistics are mean 0, var 1, weight 1, bias 0, which
    # would let a wrong fold of them pass; random ones make every term count.
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)


def _vision(name, size=224):
    import torchvision.models as tvm

    def build():
        torch.manual_seed(0)
        model = getattr(tvm, name)(weights=None)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            _randomize_batch_norms(model, gen)
        x = torch.rand(1, 3, size, size, generator=gen) * 2 - 1
        return model.eval(), (x,)
    return build


class Attention(nn.Module):
    def __init__(self, d, heads, causal, ctx=64):
        super().__init__()
        self.h, self.causal = heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        if causal:
            self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.reshape(b, t, self.h, d // self.h).transpose(1, 2)
        k = k.reshape(b, t, self.h, d // self.h).transpose(1, 2)
        v = v.reshape(b, t, self.h, d // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))
        if self.causal:
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = Attention(d, heads, causal)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.att(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    """A 4-layer pre-norm transformer encoder over [1, 128, 256] features."""

    def __init__(self, d=256, heads=4, layers=4):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d, heads, False) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.ln(x)


class Decoder(nn.Module):
    """A 2-block GPT-style decoder: token and position embeddings, causal
    attention, tied-free output head over a 512-token vocabulary."""

    def __init__(self, vocab=512, d=256, heads=4, layers=2, ctx=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, heads, True) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def _encoder():
    torch.manual_seed(0)
    m = Encoder().eval()
    return m, (torch.rand(1, 128, 256, generator=torch.Generator().manual_seed(1)) * 2 - 1,)


def _decoder():
    torch.manual_seed(0)
    m = Decoder().eval()
    return m, (torch.randint(0, 512, (1, 64), generator=torch.Generator().manual_seed(1)),)


# name -> (builder, kind): "classifier" outputs are compared by top-5 too.
MODELS = {
    "resnet18": (_vision("resnet18"), "classifier"),
    "mobilenet_v2": (_vision("mobilenet_v2"), "classifier"),
    "squeezenet1_1": (_vision("squeezenet1_1"), "classifier"),
    "shufflenet_v2_x0_5": (_vision("shufflenet_v2_x0_5"), "classifier"),
    "encoder": (_encoder, "features"),
    "decoder": (_decoder, "logits"),
}
# Not in the test set (slow on 2 cores), for the benchmark.
EXTRA = {
    "resnet50": (_vision("resnet50"), "classifier"),
}


def build(name):
    builder, kind = {**MODELS, **EXTRA}[name]
    module, inputs = builder()
    return module, inputs, kind


def export(name, path, opset=13):
    """Builds `name`, writes it to `path` as ONNX; returns (module, inputs, kind)."""
    module, inputs, kind = build(name)
    with torch.no_grad():
        torch.onnx.export(module, inputs, str(path), opset_version=opset, do_constant_folding=True,
                          input_names=["input"], output_names=["output"])
    return module, inputs, kind
