"""qwen3moe_torch.py - the forward pass of HuggingFace's Qwen3MoeForCausalLM, written for training a
small model fast.

DESIGN: transformers runs a MoE layer expert by expert (or through grouped GEMMs), which leaves a
model this small bound by launches. Here every expert runs on every token as three plain matrix
products, and the router's weights, zero outside each token's top k, scale the activations before
the down projection: sum_e w_e * down_e(silu(gate_e x) * up_e x) with w_e = 0 for unselected
experts is the sparse layer's value, and unselected experts get no gradient from the token, as in
the sparse layer. Eight times the expert arithmetic of the sparse form, in three large products
instead of hundreds of small ones. Everything else follows transformers' Qwen3Moe modules: RMSNorm
in float32 scaled by its weight in the input dtype, per-head q/k RMSNorm, rotate-half RoPE,
grouped-query attention, softmax routing in float32 with the top-k weights renormalised
(norm_topk_prob), then cast to the activations' dtype. `hf_state_dict` names the weights as an HF
checkpoint with per-expert keys; `check_against_hf` compares logits with transformers' own model.

Shapes: B batch, T tokens, H hidden, nh/nkv query/key heads of D, E experts of F, V vocabulary.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def attend(q, k, v, scale):
    """Causal softmax attention, [B,nh,T,D] each (flash kernels where this torch has them)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)).float() * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1).to(v.dtype) @ v


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, D = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.D = c["num_attention_heads"], c["num_key_value_heads"], D
        self.q_proj = nn.Linear(H, self.nh * D, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * D, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * D, bias=False)
        self.o_proj = nn.Linear(self.nh * D, H, bias=False)
        self.q_norm = RMSNorm(D, c["rms_norm_eps"])
        self.k_norm = RMSNorm(D, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.D)).transpose(1, 2)   # [B,nh,T,D]
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.D)).transpose(1, 2)  # [B,nkv,T,D]
        v = self.v_proj(x).view(B, T, self.nkv, self.D).transpose(1, 2)               # [B,nkv,T,D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)                                           # [B,nh,T,D]
        v = v.repeat_interleave(rep, dim=1)
        o = attend(q, k, v, self.D ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.D))


class DenseMoE(nn.Module):
    """Top-k routed experts computed densely (see DESIGN)."""

    def __init__(self, c):
        super().__init__()
        H, E, Fd = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
        self.E, self.F, self.k = E, Fd, c["num_experts_per_tok"]
        self.norm_topk = c["norm_topk_prob"]
        self.gate = nn.Linear(H, E, bias=False)                   # router [E, H]
        self.w_gate = nn.Parameter(torch.empty(E, Fd, H))         # gate_proj of each expert
        self.w_up = nn.Parameter(torch.empty(E, Fd, H))           # up_proj
        self.w_down = nn.Parameter(torch.empty(E, H, Fd))         # down_proj

    def forward(self, x):
        B, T, H = x.shape
        h = x.reshape(-1, H)                                      # [N,H]
        logits = self.gate(h)                                     # [N,E]
        p = F.softmax(logits, dim=1, dtype=torch.float)
        topw, topi = torch.topk(p, self.k, dim=-1)                # [N,k]
        if self.norm_topk:
            topw = topw / topw.sum(dim=-1, keepdim=True)
        topw = topw.to(h.dtype)
        w = torch.zeros(h.shape[0], self.E, dtype=h.dtype, device=h.device)
        w = w.scatter(1, topi, topw)                              # [N,E], zero off the top k
        g = F.linear(h, self.w_gate.reshape(self.E * self.F, H))  # [N,E*F]
        u = F.linear(h, self.w_up.reshape(self.E * self.F, H))    # [N,E*F]
        a = (F.silu(g) * u).view(-1, self.E, self.F) * w.unsqueeze(-1)
        wd = self.w_down.permute(1, 0, 2).reshape(H, self.E * self.F)  # [H,E*F]
        y = F.linear(a.reshape(-1, self.E * self.F), wd)          # [N,H]
        return y.view(B, T, H), logits


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = DenseMoE(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, logits = self.mlp(self.post_attention_layernorm(x))
        return x + y, logits


class Qwen3MoeDense(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        D = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        self.register_buffer("inv_freq", inv, persistent=False)
        std = c.get("initializer_range", 0.02)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
            elif isinstance(m, DenseMoE):
                for p in (m.w_gate, m.w_up, m.w_down):
                    nn.init.normal_(p, std=std)

    def forward(self, ids):
        """ids [B,T] -> logits [B,T,V] and the router logits of every layer [L][B*T,E]."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device, dtype=torch.float)
        fr = torch.outer(pos, self.inv_freq.float())              # [T,D/2]
        emb = torch.cat((fr, fr), dim=-1)
        x = self.embed_tokens(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)   # [T,D]
        router = []
        for layer in self.layers:
            x, lg = layer(x, cos, sin)
            router.append(lg)
        return self.lm_head(self.norm(x)), router


def aux_loss(router, E, k):
    """transformers' load_balancing_loss_func (no attention mask): E * sum_e f_e * P_e over every
    layer's tokens, f_e the share of top-k selections, P_e the mean router probability."""
    g = torch.cat(router, dim=0)
    p = F.softmax(g, dim=-1)
    _, sel = torch.topk(p, k, dim=-1)
    mask = F.one_hot(sel, E).float()                              # [N,k,E]
    tokens_per_expert = mask.mean(dim=0)                          # [k,E]
    prob = p.float().mean(dim=0)                                  # [E]
    return (tokens_per_expert * prob.unsqueeze(0)).sum() * E


def hf_state_dict(model):
    """The weights under Qwen3MoeForCausalLM's checkpoint names, per-expert keys."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight, "lm_head.weight": model.lm_head.weight}
    for i, L in enumerate(model.layers):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = L.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm.weight
        a = L.self_attn
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + "self_attn.%s.weight" % n] = getattr(a, n).weight
        out[p + "self_attn.q_norm.weight"] = a.q_norm.weight
        out[p + "self_attn.k_norm.weight"] = a.k_norm.weight
        m = L.mlp
        out[p + "mlp.gate.weight"] = m.gate.weight
        for e in range(m.E):
            q = p + "mlp.experts.%d." % e
            out[q + "gate_proj.weight"] = m.w_gate[e]
            out[q + "up_proj.weight"] = m.w_up[e]
            out[q + "down_proj.weight"] = m.w_down[e]
    return {k: v.detach().contiguous() for k, v in out.items()}


def load_hf_state_dict(model, sd):
    """The inverse of hf_state_dict (per-expert keys into the stacked parameters)."""
    with torch.no_grad():
        for k, v in hf_state_dict(model).items():
            v.copy_(sd[k])


def check_against_hf(c, device, log, seed=0):
    """Builds transformers' Qwen3MoeForCausalLM with config c (random weights), copies its weights
    into this model and compares float32 logits on random tokens. Returns the largest |difference|
    relative to the logits' standard deviation."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    cfg = dict(c)
    cfg["use_cache"] = False
    ref = Qwen3MoeForCausalLM(Qwen3MoeConfig(**cfg)).to(device).float().eval()
    for m in ref.modules():  # random norms too, so that they are checked
        if m.__class__.__name__.endswith("RMSNorm"):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
    mine = Qwen3MoeDense(c).to(device).float().eval()
    H, Fd = c["hidden_size"], c["moe_intermediate_size"]
    assert H != Fd and H != 2 * Fd, "the check needs shapes that tell the orientation apart"
    x = torch.randint(0, c["vocab_size"], (2, 96), device=device)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        a = ref(input_ids=x).logits.float()
    best = None
    for order in ("halves", "interleaved"):  # how a fused gate_up_proj stacks gate and up
        sd = {}
        for k, v in ref.state_dict().items():
            if k.endswith("mlp.experts.gate_up_proj"):  # transformers 5 fuses the experts
                p = k[:-len("gate_up_proj")]
                if v.shape[-1] == 2 * Fd:
                    v = v.transpose(1, 2)                  # [E,2F,H]
                for e in range(v.shape[0]):
                    g, u = (v[e, :Fd], v[e, Fd:]) if order == "halves" else (v[e, 0::2], v[e, 1::2])
                    sd["%s%d.gate_proj.weight" % (p, e)] = g
                    sd["%s%d.up_proj.weight" % (p, e)] = u
            elif k.endswith("mlp.experts.down_proj"):
                p = k[:-len("down_proj")]
                if v.shape[1] == Fd:
                    v = v.transpose(1, 2)                  # [E,H,F]
                for e in range(v.shape[0]):
                    sd["%s%d.down_proj.weight" % (p, e)] = v[e]
            else:
                sd[k] = v
        missing = [k for k in hf_state_dict(mine) if k not in sd]
        if missing:
            raise KeyError("transformers' model has no %s (its keys: %s)"
                           % (missing[:4], list(ref.state_dict())[:24]))
        load_hf_state_dict(mine, sd)
        with torch.no_grad():
            b = mine(x)[0].float()
        rel = ((a - b).abs().max() / a.std()).item()
        log("model check against transformers' Qwen3MoeForCausalLM (%s gate/up): max |logit "
            "diff| = %.3g x std" % (order, rel))
        best = rel if best is None else min(best, rel)
    torch.backends.cuda.matmul.allow_tf32 = prev
    return best
