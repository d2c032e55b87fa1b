#!/usr/bin/env python3
"""train.py - trains the small qwen3moe model that hotmoe ships (docs/TRAINED_MODEL.md).

GPU machine (PyTorch + transformers, CUDA, no network). Runs in chunks so that each device call
stays under its 10-minute limit: every call trains until --max-seconds, saves the whole state
(weights, AdamW, step) to OUT/state.pt and exits 0 with "train: CHUNK DONE"; the next call with
--resume carries on bit-for-bit where it stopped (batches are a function of (seed, step)). The
call that reaches the token budget evaluates, exports and prints "train: FINISHED".

    python3 tools/train/train.py --data DIR --tokenizer TOKDIR --out OUT --max-seconds 480 --resume
    python3 tools/train/train.py --sizes            # parameter count and GGUF sizes, no torch

DIR holds train.txt and heldout.txt (tools/train/make_corpus.sh, documents separated by lines
"<|endoftext|>"); TOKDIR holds tokenizer.json + tokenizer_config.json (train_tokenizer.py).
OUT gets: tokens_train.u16 / tokens_heldout.u16 (the tokenized splits, cached), state.pt,
loss.csv (step, tokens, lr, loss, aux_loss, tok/s, elapsed, heldout_loss every --eval-every steps),
train.log, and at the end eval.json (held-out loss, perplexity, bits per byte; the unigram
baseline's on the same held-out tokens) and hf/ (config.json, generation_config.json,
model.safetensors with per-expert keys mlp.experts.E.{gate,up,down}_proj.weight, tokenizer.json,
tokenizer_config.json): the folder `hotmoe convert` reads.
"""
import argparse
import json
import math
import os
import sys
import time

SEP = "<|endoftext|>"


def model_config(vocab, a):
    """The Qwen3MoeConfig fields of the model (plain dict: --sizes needs no transformers)."""
    return dict(
        vocab_size=vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        intermediate_size=a.expert_ff, moe_intermediate_size=a.expert_ff,
        num_experts=a.experts, num_experts_per_tok=a.top_k, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, attention_dropout=0.0,
        tie_word_embeddings=False, output_router_logits=True,
        router_aux_loss_coef=a.aux_coef, use_cache=False,
        bos_token_id=vocab - 3, eos_token_id=vocab - 1, pad_token_id=vocab - 3,
    )


def sizes(c):
    """Parameter counts and expected GGUF sizes (bytes) for f32 / q8_0 / q4_k_m."""
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    D, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    E, F, K = c["num_experts"], c["moe_intermediate_size"], c["num_experts_per_tok"]
    mats = []  # (rows, cols, name): cols is the row length GGUF quantises along
    mats += [(V, H, "token_embd"), (V, H, "output")]
    vecs = H  # output_norm
    for _ in range(L):
        mats += [(nh * D, H, "attn_q"), (nkv * D, H, "attn_k"), (nkv * D, H, "attn_v"),
                 (H, nh * D, "attn_output"), (E, H, "ffn_gate_inp"),
                 (E * F, H, "ffn_gate_exps"), (E * F, H, "ffn_up_exps"), (E * H, F, "ffn_down_exps")]
        vecs += 2 * H + 2 * D  # attn_norm, ffn_norm, attn_q_norm, attn_k_norm
    total = sum(r * k for r, k, _ in mats) + vecs
    active = total - L * (E - K) * 3 * H * F - V * H  # the embedding is a lookup
    f32 = 4 * total
    q8 = sum(r * k * 34 // 32 for r, k, _ in mats) + 4 * vecs
    # q4_k_m as llama-quant picks: q4_K (144 B / 256), q6_K (210 B / 256) for output, attn_v and
    # ffn_down in about half the layers; rows whose length is not a multiple of 256 fall back
    # (q4_K -> q5_0 22 B / 32, q6_K -> q8_0); the router stays f32. An estimate within ~5%.
    def q(r, k, kind):
        if k % 256 == 0:
            return r * k // 256 * (144 if kind == 4 else 210)
        return r * k // 32 * (22 if kind == 4 else 34)
    q4 = 4 * vecs
    for r, k, n in mats:
        if n == "ffn_gate_inp":
            q4 += 4 * r * k
        elif n in ("output", "attn_v"):
            q4 += q(r, k, 6)
        elif n == "ffn_down_exps":
            q4 += (q(r, k, 6) + q(r, k, 4)) // 2
        else:
            q4 += q(r, k, 4)
    hdr = 40000 + 12 * V + 8 * V  # metadata + vocabulary strings (rough)
    return dict(params=total, active_params=active, gguf_f32=f32 + hdr, gguf_q8_0=q8 + hdr,
                gguf_q4_k_m=q4 + hdr)


def read_docs(path):
    cur = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.rstrip("\n") == SEP:
                if cur:
                    yield "".join(cur).rstrip("\n")
                cur = []
            else:
                cur.append(line)
    if cur:
        yield "".join(cur).rstrip("\n")


def tokenize_file(tok, src, dst, eot, log):
    """Every document's ids followed by <|endoftext|>, as uint16, cached in dst."""
    import numpy as np
    if os.path.exists(dst):
        return np.memmap(dst, dtype=np.uint16, mode="r")
    t0 = time.time()
    tmp = dst + ".tmp"
    n = nbytes = 0
    batch = []
    with open(tmp, "wb") as f:
        def flush():
            nonlocal n
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                ids = np.asarray(enc.ids + [eot], dtype=np.uint16)
                f.write(ids.tobytes())
                n += len(ids)
            batch.clear()
        for d in read_docs(src):
            batch.append(d)
            nbytes += len(d.encode())
            if len(batch) >= 256:
                flush()
        flush()
    os.replace(tmp, dst)
    log("tokenized %s: %d bytes -> %d tokens (%.2f bytes/token) in %.0f s"
        % (src, nbytes, n, nbytes / max(n, 1), time.time() - t0))
    return np.memmap(dst, dtype=np.uint16, mode="r")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="corpus")
    ap.add_argument("--tokenizer", default="tok")
    ap.add_argument("--out", default="train_out")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/state.pt if there")
    ap.add_argument("--max-seconds", type=float, default=480, help="wall time of this chunk")
    ap.add_argument("--fit-seconds", type=float, default=0,
                    help="shorten the schedule (never lengthen it) so that training ends this many "
                         "seconds after the start: the step count is fixed from the speed of the "
                         "first 30 steps and logged (pass the logged --tokens to repeat the run)")
    ap.add_argument("--sizes", action="store_true", help="print the sizes and exit")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test")
    ap.add_argument("--vocab", type=int, default=8192, help="only for --sizes")
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-ff", type=int, default=128)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    # training
    ap.add_argument("--tokens", type=float, default=150e6, help="token budget of the schedule")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--save-dtype", default="float16", choices=["float32", "float16", "bfloat16"],
                    help="dtype of the exported checkpoint (float16: 35 MB, comes back from the "
                         "GPU machine in three parts)")
    a = ap.parse_args()

    if a.sizes:
        c = model_config(a.vocab, a)
        s = sizes(c)
        print(json.dumps(dict(config=c, **s), indent=1))
        return

    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "train.log"), "a")

    def log(msg):
        line = "[%7.1fs] %s" % (time.time() - t_start, msg)
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    import numpy as np
    import torch
    import transformers
    from tokenizers import Tokenizer
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qwen3moe_torch as qm

    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    V = tok.get_vocab_size()
    eot = tok.token_to_id("<|endoftext|>")
    assert eot == V - 3 and tok.token_to_id("<|im_end|>") == V - 1, "tokenizer layout"
    cdict = model_config(V, a)
    s = sizes(cdict)
    log("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__,
                                           torch.cuda.get_device_name(0) if a.device == "cuda" else a.device))
    log("model: %d params (%d active per token), GGUF f32 %.1f MB, q8_0 %.1f MB, q4_k_m ~%.1f MB"
        % (s["params"], s["active_params"], s["gguf_f32"] / 1e6, s["gguf_q8_0"] / 1e6,
           s["gguf_q4_k_m"] / 1e6))
    if s["gguf_q8_0"] > 20e6:
        log("WARNING: q8_0 GGUF over 20 MB")

    train = tokenize_file(tok, os.path.join(a.data, "train.txt"),
                          os.path.join(a.out, "tokens_train.u16"), eot, log)
    held = tokenize_file(tok, os.path.join(a.data, "heldout.txt"),
                         os.path.join(a.out, "tokens_heldout.u16"), eot, log)

    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # the dense formulation must compute transformers' function: checked on random weights with
    # a different expert width (so that no two weight shapes coincide) before any training
    chk = dict(cdict, moe_intermediate_size=96, intermediate_size=96)
    rel = qm.check_against_hf(chk, dev, log)
    if not rel < 1e-4:
        sys.exit("train: the training model does not match transformers (%.3g x std)" % rel)
    torch.manual_seed(a.seed)
    model = qm.Qwen3MoeDense(cdict).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    log("torch parameter count %d (formula %d)" % (nparam, s["params"]))

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev.type == "cuda" else {}))
    tokens_per_step = a.batch * a.seq
    total_steps = int(math.ceil(a.tokens / tokens_per_step))

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        p = min(1.0, (step - a.warmup) / max(1, total_steps - a.warmup))
        return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    step = 0
    elapsed_before = 0.0
    state_path = os.path.join(a.out, "state.pt")
    if a.resume and os.path.exists(state_path):
        st = torch.load(state_path, map_location=dev, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed_before = st["step"], st["elapsed"]
        total_steps = st.get("total_steps", total_steps)
        if st["args"]["tokens"] != a.tokens or st["args"]["batch"] != a.batch:
            log("WARNING: resuming with a different budget/batch than the state was made with")
        log("resumed at step %d (%.0f s trained before)" % (step, elapsed_before))
    elif os.path.exists(state_path):
        sys.exit("%s exists: pass --resume, or remove it to start again" % state_path)
    log("schedule: %d steps x %d tokens = %.1fM tokens (%.2f epochs of %.1fM train tokens)"
        % (total_steps, tokens_per_step, total_steps * tokens_per_step / 1e6,
           total_steps * tokens_per_step / len(train), len(train) / 1e6))

    def batch_at(step, src=train, b=a.batch, seed=a.seed):
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(src) - a.seq - 1, size=b)
        x = np.stack([src[s:s + a.seq] for s in starts]).astype(np.int64)
        return torch.from_numpy(x).to(dev, non_blocking=True)

    @torch.no_grad()
    def heldout_loss(windows=None):
        """Mean next-token loss over non-overlapping held-out windows (all of them if None)."""
        model.eval()
        n = (len(held) - 1) // a.seq
        idx = list(range(n)) if windows is None else list(range(0, n, max(1, n // windows)))[:windows]
        tot, cnt = 0.0, 0
        for i in range(0, len(idx), a.batch):
            x = np.stack([held[j * a.seq:(j + 1) * a.seq] for j in idx[i:i + a.batch]]).astype(np.int64)
            x = torch.from_numpy(x).to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = model(x)[0]
            lp = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, V),
                                                   x[:, 1:].reshape(-1), reduction="sum")
            tot += lp.item()
            cnt += x[:, 1:].numel()
        model.train()
        return tot / max(cnt, 1), cnt, idx

    csv_path = os.path.join(a.out, "loss.csv")
    if not os.path.exists(csv_path):
        with open(csv_path, "w") as f:
            f.write("step,tokens,lr,loss,aux_loss,tok_per_s,elapsed_s,heldout_loss\n")
    model.train()
    t_chunk = time.time()
    t_log, tok_log = time.time(), 0
    acc_loss = acc_aux = 0.0
    acc_n = 0
    fit_at = step + 30 if a.fit_seconds > 0 and step == 0 else -1
    t_fit = time.time()
    while step < total_steps:
        if time.time() - t_start > a.max_seconds:
            break
        if step == 5:
            t_fit = time.time()  # the first steps include allocations and kernel choices
        if step == fit_at:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t_fit) / (fit_at - 5)
            fit = fit_at + int((a.fit_seconds - (time.time() - t_start)) / per_step * 0.97)
            if fit < total_steps:
                total_steps = max(fit, a.warmup + 1)
                log("schedule fitted to --fit-seconds %.0f: %d steps (%.1f ms each): "
                    "--tokens %d repeats it" % (a.fit_seconds, total_steps, per_step * 1e3,
                                                total_steps * tokens_per_step))
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_at(step)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits, router = model(x)
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, V),
                                                   x[:, 1:].reshape(-1))
            aux_t = qm.aux_loss(router, a.experts, a.top_k)
        loss = ce + a.aux_coef * aux_t
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tok_log += tokens_per_step
        aux = aux_t.item()
        acc_loss += ce.item()
        acc_aux += aux
        acc_n += 1
        if step % a.log_every == 0 or step == total_steps:
            now = time.time()
            tps = tok_log / (now - t_log)
            hl = ""
            if step % a.eval_every == 0 or step == total_steps:
                hl = "%.4f" % heldout_loss(64)[0]
            el = elapsed_before + now - t_chunk
            with open(csv_path, "a") as f:
                f.write("%d,%d,%.6g,%.4f,%.4f,%.0f,%.1f,%s\n" % (step, step * tokens_per_step, lr,
                        acc_loss / acc_n, acc_aux / acc_n, tps, el, hl))
            if step % (a.log_every * 10) == 0 or hl:
                left = (total_steps - step) * tokens_per_step / max(tps, 1)
                log("step %d/%d loss %.4f aux %.3f lr %.2e %.0f tok/s heldout %s; ~%.1f min left"
                    % (step, total_steps, acc_loss / acc_n, acc_aux / acc_n, lr, tps, hl or "-",
                       left / 60))
            t_log, tok_log = time.time(), 0
            acc_loss = acc_aux = 0.0
            acc_n = 0

    elapsed = elapsed_before + time.time() - t_chunk
    tmp = state_path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "elapsed": elapsed, "args": vars(a),
                "total_steps": total_steps}, tmp)
    os.replace(tmp, state_path)
    if step < total_steps:
        log("train: CHUNK DONE at step %d/%d (%.0f s trained); run again with --resume"
            % (step, total_steps, elapsed))
        return

    # evaluation: the model and a unigram model of the train tokens, on the same held-out tokens
    hl, cnt, _ = heldout_loss(None)
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=V).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    n = (len(held) - 1) // a.seq
    tgt = np.concatenate([np.asarray(held[j * a.seq + 1:(j + 1) * a.seq], dtype=np.int64)
                          for j in range(n)])
    uni = float(-logp[tgt].mean())
    hbytes = os.path.getsize(os.path.join(a.data, "heldout.txt"))
    bpt = hbytes / len(held)  # bytes per token of the held-out split
    ev = {"heldout_tokens": int(cnt), "heldout_loss": hl, "heldout_ppl": math.exp(hl),
          "heldout_bits_per_byte": hl / math.log(2) / bpt,
          "unigram_loss": uni, "unigram_ppl": math.exp(uni),
          "unigram_bits_per_byte": uni / math.log(2) / bpt,
          "bytes_per_token": bpt, "steps": step, "tokens": step * tokens_per_step,
          "train_seconds": elapsed, "params": nparam, **{k: s[k] for k in s if k != "params"}}
    with open(os.path.join(a.out, "eval.json"), "w") as f:
        json.dump(ev, f, indent=1)
    log("eval: held-out loss %.4f ppl %.2f (%.3f bits/byte); unigram loss %.4f ppl %.1f"
        % (hl, ev["heldout_ppl"], ev["heldout_bits_per_byte"], uni, ev["unigram_ppl"]))
    export(model, cdict, a, log)
    log("train: FINISHED")


def export(model, cdict, a, log):
    """Saves the HF folder OUT/hf (per-expert keys, --save-dtype) and checks that transformers
    loads it back with the same logits as the model in memory."""
    import shutil
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3MoeConfig
    import qwen3moe_torch as qm
    hf = os.path.join(a.out, "hf")
    if os.path.exists(hf):
        shutil.rmtree(hf)
    os.makedirs(hf)
    dtype = getattr(torch, a.save_dtype)
    cfg = dict(cdict, use_cache=True, output_router_logits=False)
    Qwen3MoeConfig(**cfg).save_pretrained(hf)
    sd = {k: v.to(dtype).contiguous() for k, v in qm.hf_state_dict(model).items()}
    save_file(sd, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), os.path.join(hf, f))
    V = cdict["vocab_size"]
    GenerationConfig(bos_token_id=V - 3, eos_token_id=[V - 1, V - 3], pad_token_id=V - 3,
                     do_sample=True, temperature=0.7, top_p=0.9).save_pretrained(hf)
    log("exported %s: %d tensors, %s, %.1f MB" % (hf, len(sd), a.save_dtype,
        os.path.getsize(os.path.join(hf, "model.safetensors")) / 1e6))
    # reload with transformers and compare with the model in memory holding the saved weights
    m2, info = AutoModelForCausalLM.from_pretrained(hf, output_loading_info=True,
                                                    dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    dev = a.device
    m2.to(dev).eval()
    mine = qm.Qwen3MoeDense(cdict).to(dev).float().eval()
    qm.load_hf_state_dict(mine, {k: v.float() for k, v in sd.items()})
    x = torch.arange(1, 129, device=dev).unsqueeze(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        r = m2(input_ids=x).logits.float()
        d = ((r - mine(x)[0].float()).abs().max() / r.std()).item()
    log("reload check: %s, max |logit difference| %.3g x std"
        % (bad or "no missing/unexpected keys", d))
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    for prompt in ("The history of the", "The Debian package manager", "def main():"):
        ids = tok.encode(prompt).ids
        with torch.no_grad():
            g = m2.generate(torch.tensor([ids], device=dev), max_new_tokens=48, do_sample=False)
        log("sample (greedy): %r" % tok.decode(g[0].tolist()))


if __name__ == "__main__":
    main()
