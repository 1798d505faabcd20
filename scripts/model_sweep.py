"""Real models beyond test/model_zoo.py (40 Hugging Face and torchvision models built from small
configs with random weights, nothing downloaded) through tracea.compile, and 7 of them through
torch.compile(backend="tracea"), each checked against eager PyTorch. A long sweep, not a test
(about 20 minutes on 2 cores); the suite has targeted tests for what it found.

    .venv/bin/python scripts/model_sweep.py [--out DIR] [NAME ...]   # all, or the named models
    .venv/bin/python scripts/model_sweep.py --one NAME [--dynamo]    # one model in this process

Each model runs in a child process (300 s timeout, OMP_NUM_THREADS=2, an empty kernel cache) so
that a crash or hang stops only it. A line per model (status: ok / wrong numerics / compile
error / crash / timeout / skipped, compile seconds, relative error = max |error| / max |eager|);
results in DIR/results.jsonl, logs in DIR/logs, compiler crash reproducers in DIR/crashes
(DIR defaults to a new temporary directory).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import warnings

MAIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
PY = sys.executable
TIMEOUT = 300


# --------------------------------------------------------------------------- model builders
def _tokens(batch=2, seq=32, vocab=1000, low=0):
    import torch
    return torch.randint(low, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def _image(size=64, batch=1):
    import torch
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def distilbert():
    import transformers as T
    cfg = T.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=1000, max_position_embeddings=64)
    return T.DistilBertModel(cfg), (_tokens(),)


def roberta():
    import transformers as T
    cfg = T.RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                          vocab_size=1000, max_position_embeddings=66)
    return T.RobertaModel(cfg), (_tokens(low=3),)


def albert():
    import transformers as T
    cfg = T.AlbertConfig(embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, vocab_size=1000, max_position_embeddings=64)
    return T.AlbertModel(cfg), (_tokens(),)


def electra():
    import transformers as T
    cfg = T.ElectraConfig(embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, vocab_size=1000, max_position_embeddings=64)
    return T.ElectraModel(cfg), (_tokens(),)


def deberta_v2():
    import transformers as T
    cfg = T.DebertaV2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            vocab_size=1000, max_position_embeddings=64, relative_attention=True,
                            pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=-1,
                            norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False)
    return T.DebertaV2Model(cfg), (_tokens(),)


def bart():
    import transformers as T
    cfg = T.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                       max_position_embeddings=64, use_cache=False)
    m = T.BartModel(cfg)
    return Fn(lambda a, b: m(input_ids=a, decoder_input_ids=b), m), (_tokens(seq=32), _tokens(seq=16, low=3))


def t5_full():
    import transformers as T
    cfg = T.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                     vocab_size=1000, use_cache=False)
    m = T.T5Model(cfg)
    return Fn(lambda a, b: m(input_ids=a, decoder_input_ids=b), m), (_tokens(seq=32), _tokens(seq=16))


def _decoder_cfg(cls, **extra):
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              vocab_size=1000, max_position_embeddings=64, use_cache=False)
    kw.update(extra)
    return cls(**kw)


def mistral():
    import transformers as T
    return T.MistralModel(_decoder_cfg(T.MistralConfig, num_key_value_heads=2)), (_tokens(),)


def qwen2():
    import transformers as T
    return T.Qwen2Model(_decoder_cfg(T.Qwen2Config, num_key_value_heads=2)), (_tokens(),)


def phi():
    import transformers as T
    return T.PhiModel(_decoder_cfg(T.PhiConfig, partial_rotary_factor=0.5)), (_tokens(),)


def gemma():
    import transformers as T
    return T.GemmaModel(_decoder_cfg(T.GemmaConfig, num_key_value_heads=1, head_dim=16)), (_tokens(),)


def gpt_neox():
    import transformers as T
    cfg = T.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          vocab_size=1000, max_position_embeddings=64, rotary_pct=0.25, use_cache=False)
    return T.GPTNeoXModel(cfg), (_tokens(),)


def opt():
    import transformers as T
    cfg = T.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000,
                      max_position_embeddings=64, word_embed_proj_dim=64, use_cache=False)
    return T.OPTModel(cfg), (_tokens(low=3),)


def bloom():
    import transformers as T
    cfg = T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000, use_cache=False)
    return T.BloomModel(cfg), (_tokens(),)


def falcon():
    import transformers as T
    cfg = T.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000,
                         max_position_embeddings=64, use_cache=False)
    return T.FalconModel(cfg), (_tokens(),)


def clip_vision():
    import transformers as T
    cfg = T.CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             image_size=32, patch_size=8)
    return T.CLIPVisionModel(cfg), (_image(32, 2),)


def swinv2_hf():
    import transformers as T
    cfg = T.Swinv2Config(image_size=32, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4)
    return T.Swinv2Model(cfg), (_image(32, 1),)


def deit():
    import transformers as T
    cfg = T.DeiTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8)
    return T.DeiTModel(cfg), (_image(32, 2),)


def beit():
    import transformers as T
    cfg = T.BeitConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, use_relative_position_bias=True, use_mean_pooling=True)
    return T.BeitModel(cfg), (_image(32, 2),)


def convnextv2_hf():
    import transformers as T
    cfg = T.ConvNextV2Config(hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, image_size=64)
    return T.ConvNextV2Model(cfg), (_image(64),)


def resnet_hf():
    import transformers as T
    cfg = T.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1], layer_type="bottleneck")
    return T.ResNetModel(cfg), (_image(64),)


def whisper_encoder():
    import torch
    import transformers as T
    cfg = T.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                          num_mel_bins=80, max_source_positions=16, max_target_positions=32, use_cache=False,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                          suppress_tokens=None, begin_suppress_tokens=None)
    enc = T.WhisperModel(cfg).get_encoder()
    return enc, (torch.randn(1, 80, 32, generator=torch.Generator().manual_seed(1)),)


def wav2vec2():
    import torch
    import transformers as T
    cfg = T.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                           conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                           num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32)
    return T.Wav2Vec2Model(cfg), (torch.randn(1, 1600, generator=torch.Generator().manual_seed(1)),)


def mobilevit():
    import transformers as T
    cfg = T.MobileViTConfig(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 96],
                            num_attention_heads=4)
    return T.MobileViTModel(cfg), (_image(64),)


def segformer():
    import transformers as T
    cfg = T.SegformerConfig(num_encoder_blocks=4, depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
                            num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=64, num_labels=5)
    return T.SegformerForSemanticSegmentation(cfg), (_image(64),)


def _tv():
    sys.path.insert(0, f"{MAIN}/test")
    import model_zoo
    return model_zoo.import_torchvision().models


def vgg11_bn():
    return _tv().vgg11_bn(num_classes=10), (_image(64),)


def densenet121():
    return _tv().densenet121(num_classes=10), (_image(64),)


def squeezenet1_1():
    return _tv().squeezenet1_1(num_classes=10), (_image(64),)


def shufflenet_v2_x0_5():
    return _tv().shufflenet_v2_x0_5(num_classes=10), (_image(64),)


def mnasnet0_5():
    return _tv().mnasnet0_5(num_classes=10), (_image(64),)


def mobilenet_v2():
    return _tv().mobilenet_v2(num_classes=10), (_image(64),)


def resnext50_32x4d():
    return _tv().resnext50_32x4d(num_classes=10), (_image(64),)


def wide_resnet50_2():
    return _tv().wide_resnet50_2(num_classes=10), (_image(64),)


def regnet_y_400mf():
    return _tv().regnet_y_400mf(num_classes=10), (_image(64),)


def efficientnet_v2_s():
    return _tv().efficientnet_v2_s(num_classes=10), (_image(64),)


def googlenet():
    return _tv().googlenet(num_classes=10, aux_logits=False, init_weights=True), (_image(64),)


def inception_v3():
    return _tv().inception_v3(num_classes=10, aux_logits=False, init_weights=True), (_image(96),)


def swin_v2_t():
    return _tv().swin_v2_t(num_classes=10), (_image(64),)


def maxvit_t():
    return _tv().maxvit_t(num_classes=10), (_image(224),)


def Fn(fn, owner):
    import torch

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.owner = owner

        def forward(self, *args):
            return fn(*args)
    return Wrap()


def raft_small():
    import torch
    models = _tv()
    m = models.optical_flow.raft_small()
    g = torch.Generator().manual_seed(1)
    return Fn(lambda a, b: m(a, b, num_flow_updates=2), m), (torch.randn(1, 3, 128, 128, generator=g), torch.randn(1, 3, 128, 128, generator=g))


MODELS = {f.__name__: f for f in (
    distilbert, roberta, albert, electra, deberta_v2, bart, t5_full, mistral, qwen2, phi, gemma, gpt_neox, opt,
    bloom, falcon, clip_vision, swinv2_hf, deit, beit, convnextv2_hf, resnet_hf, whisper_encoder, wav2vec2,
    mobilevit, segformer,
    vgg11_bn, densenet121, squeezenet1_1, shufflenet_v2_x0_5, mnasnet0_5, mobilenet_v2, resnext50_32x4d,
    wide_resnet50_2, regnet_y_400mf, efficientnet_v2_s, googlenet, inception_v3, swin_v2_t, maxvit_t, raft_small)}

DYNAMO = ["distilbert", "bart", "mistral", "squeezenet1_1", "clip_vision", "wav2vec2", "bloom"]


# --------------------------------------------------------------------------- one model (child)
def _innermost_tracea_frame(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/tracea/" in f.filename]
    if not frames:
        return None
    f = frames[-1]
    return f"{os.path.relpath(f.filename, MAIN)}:{f.lineno} in {f.name}"


def _build(name):
    sys.path.insert(0, f"{MAIN}/test")
    import model_zoo
    return model_zoo.prepared(MODELS[name])


def _compare(expected, got):
    import torch
    from torch.utils._pytree import tree_leaves
    le, lg = tree_leaves(expected), tree_leaves(got)
    res = {"n_outputs": len(le), "type_match": type(expected) is type(got), "outputs": []}
    if len(le) != len(lg):
        res["mismatch"] = f"{len(le)} eager leaves vs {len(lg)} compiled leaves"
        return res, float("inf")
    worst = 0.0
    for i, (w, h) in enumerate(zip(le, lg)):
        if not isinstance(w, torch.Tensor):
            res["outputs"].append({"i": i, "nontensor": repr(w)[:80], "equal": w == h})
            continue
        o = {"i": i, "shape": list(w.shape), "dtype": str(w.dtype)}
        if not isinstance(h, torch.Tensor):
            o["error"] = f"compiled gave {type(h).__name__}"
            worst = float("inf")
        elif tuple(h.shape) != tuple(w.shape) or h.dtype != w.dtype:
            o["error"] = f"compiled gave {h.dtype} {list(h.shape)}"
            worst = float("inf")
        elif w.numel() == 0:
            o["rel"] = 0.0
        elif w.is_floating_point():
            scale = w.abs().max().item()
            err = (h.double() - w.double()).abs().max().item()
            rel = err / scale if scale > 0 else err
            if h.isnan().any() and not w.isnan().any():
                rel = float("inf")
                o["nan"] = True
            o.update(abs=err, scale=scale, rel=rel)
            worst = max(worst, rel)
        else:
            eq = bool((h == w).all())
            o["equal"] = eq
            if not eq:
                worst = float("inf")
        res["outputs"].append(o)
    return res, worst


def run_one(name, dynamo=False):
    import tracea  # before torch_mlir and before torch's libgomp
    import torch
    sys.path.insert(0, f"{MAIN}/test")
    import model_zoo  # noqa: F401  (torchvision importable on the CPU wheel, before transformers)
    out = {"name": name, "mode": "dynamo" if dynamo else "tracea.compile"}
    try:
        model, inputs = _build(name)
    except Exception as e:  # noqa: BLE001
        out.update(status="skipped", reason=f"build failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return out
    try:
        with torch.no_grad():
            t = time.perf_counter()
            expected = model(*inputs)
            out["eager_s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001
        out.update(status="skipped", reason=f"eager failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return out
    out["params"] = sum(p.numel() for p in model.parameters())
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            t = time.perf_counter()
            if dynamo:
                torch._dynamo.reset()
                compiled = torch.compile(model, backend="tracea", dynamic=False)
                got = compiled(*inputs)  # compiles at first call
                out["compile_s"] = time.perf_counter() - t
                t = time.perf_counter()
                got = compiled(*inputs)
                out["run_s"] = time.perf_counter() - t
            else:
                compiled = tracea.compile(model, inputs)
                out["compile_s"] = time.perf_counter() - t
                t = time.perf_counter()
                got = compiled(*inputs)
                out["run_s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001
        out["compile_s"] = time.perf_counter() - t
        out.update(status="compile error", exc_type=type(e).__name__, message=str(e)[:2000],
                   frame=_innermost_tracea_frame(e))
        out["traceback"] = traceback.format_exc()[-6000:]
        out["warnings"] = sorted({str(w.message)[:300] for w in caught if "tracea" in str(w.message).lower()})
        return out
    out["warnings"] = sorted({str(w.message)[:300] for w in caught if "tracea" in str(w.message).lower()})
    if dynamo:
        from tracea.frontend import dynamo as D
        out["dynamo_fallbacks"] = dict(D.fallbacks)
    else:
        try:
            pl = compiled.placement
            out["placement"] = {"compiled_ops": sum(pl.compiled.values()), "eager": dict(pl.eager),
                                "regions": pl.regions, "reasons": {k: v[:200] for k, v in pl.reasons.items()}}
            out["kind"] = type(compiled).__name__
            if hasattr(compiled, "why"):
                out["export_fallback_why"] = compiled.why[:300]
        except Exception as e:  # noqa: BLE001
            out["placement_error"] = repr(e)[:200]
    cmp, worst = _compare(expected, got)
    out["compare"] = cmp
    out["rel_err"] = worst
    out["status"] = "ok" if worst <= 1e-3 else "wrong numerics"
    return out


# --------------------------------------------------------------------------- driver
def main():
    args = sys.argv[1:]
    if args and args[0] == "--one":
        name = args[1]
        res = run_one(name, dynamo="--dynamo" in args)
        print("@@RESULT " + json.dumps(res, default=str), flush=True)
        return
    out = None
    if "--out" in args:
        at = args.index("--out")
        out, args = args[at + 1], args[:at] + args[at + 2:]
    if any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    import tempfile
    out_dir = os.path.abspath(out or tempfile.mkdtemp(prefix="tracea-model-sweep-"))
    print(f"results in {out_dir}", flush=True)
    only = args or None
    env = dict(os.environ, OMP_NUM_THREADS="2", TRACEA_CACHE_DIR=f"{out_dir}/cache", TRACEA_CRASH_DIR=f"{out_dir}/crashes",
               TRACEA_PROGRESS="1", PYTHONUNBUFFERED="1")
    jobs = [(n, False) for n in MODELS] + [(n, True) for n in DYNAMO]
    if only:
        jobs = [(n, d) for n, d in jobs if n in only or (n + ":dynamo" in only and d)]
        jobs = [(n, d) for n, d in jobs if not d or n + ":dynamo" in only]
    os.makedirs(f"{out_dir}/logs", exist_ok=True)
    results_path = f"{out_dir}/results.jsonl"
    for name, dyn in jobs:
        tag = name + (":dynamo" if dyn else "")
        cmd = [PY, __file__, "--one", name] + (["--dynamo"] if dyn else [])
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=MAIN)
            stdout, stderr, rc = p.stdout, p.stderr, p.returncode
            timed_out = False
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            rc, timed_out = None, True
        wall = time.perf_counter() - t
        with open(f"{out_dir}/logs/{tag.replace(':', '_')}.log", "w") as f:
            f.write(f"$ {' '.join(cmd)}\nrc={rc} timeout={timed_out} wall={wall:.1f}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
        res = None
        for line in stdout.splitlines():
            if line.startswith("@@RESULT "):
                res = json.loads(line[9:])
        if res is None:
            res = {"name": name, "mode": "dynamo" if dyn else "tracea.compile"}
            if timed_out:
                res["status"] = "timeout"
            elif rc is not None and rc < 0:
                import signal
                res["status"] = f"crash (signal {signal.Signals(-rc).name})"
            else:
                res["status"] = f"crash (exit {rc})"
            res["stderr_tail"] = "\n".join(stderr.splitlines()[-40:])
        res["wall_s"] = wall
        with open(results_path, "a") as f:
            f.write(json.dumps(res, default=str) + "\n")
        extra = res.get("rel_err", res.get("exc_type", res.get("reason", "")))
        print(f"{tag:28s} {res['status']:18s} compile={res.get('compile_s', float('nan')):7.1f}s wall={wall:6.1f}s {extra}",
              flush=True)


if __name__ == "__main__":
    main()
