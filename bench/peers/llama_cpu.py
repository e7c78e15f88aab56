# The PyTorch peer of bench/train.ts: the same Llama (RMSNorm, RoPE with rotate-half, causal attention with
# grouped-query heads, SwiGLU, tied embeddings), the same batch of random tokens, AdamW with the same constants
# and clipping, written in plain PyTorch (no transformers needed), on the CPU with `threads` threads.
# Usage: python3 llama_cpu.py CONFIG_JSON BATCH STEPS THREADS  -> one JSON line: tokens/s, threads, version.
import json, math, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

c = json.loads(sys.argv[1])
B, steps, threads = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
T, D, H, K, hd, FF, V, L = (c[k] for k in ("length", "hiddenSize", "heads", "kvHeads", "headDim", "intermediateSize", "vocabSize", "layers"))
eps = c["rmsNormEps"]

inv = 1.0 / (c["ropeTheta"] ** (torch.arange(0, hd, 2).float() / hd))
angles = torch.outer(torch.arange(T).float(), inv)
angles = torch.cat([angles, angles], -1)
cos, sin = angles.cos(), angles.sin()
mask = torch.full((T, T), float("-inf")).triu(1)


def rotate(x):  # (B, heads, T, hd)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_norm, self.post_norm = RMSNorm(), RMSNorm()
        self.q = nn.Linear(D, H * hd, bias=False)
        self.k = nn.Linear(D, K * hd, bias=False)
        self.v = nn.Linear(D, K * hd, bias=False)
        self.o = nn.Linear(H * hd, D, bias=False)
        self.gate = nn.Linear(D, FF, bias=False)
        self.up = nn.Linear(D, FF, bias=False)
        self.down = nn.Linear(FF, D, bias=False)

    def forward(self, x):
        b = x.shape[0]
        h = self.input_norm(x)
        q = rotate(self.q(h).view(b, T, H, hd).transpose(1, 2))
        k = rotate(self.k(h).view(b, T, K, hd).transpose(1, 2)).repeat_interleave(H // K, 1)
        v = self.v(h).view(b, T, K, hd).transpose(1, 2).repeat_interleave(H // K, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, T, H * hd))
        m = self.post_norm(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Layer() for _ in range(L)])
        self.norm = RMSNorm()

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.embed.weight.t()


torch.manual_seed(0)
model = Llama()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def step():
    ids, targets = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    loss = F.cross_entropy(model(ids).view(-1, V), targets.view(-1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


step()
started = time.perf_counter()
for _ in range(steps):
    step()
seconds = time.perf_counter() - started
print(json.dumps({"tokens_per_s": steps * B * T / seconds, "threads": torch.get_num_threads(), "version": torch.__version__}))
