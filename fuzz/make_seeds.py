#!/usr/bin/env python3
"""make_seeds.py — writes the seed corpora fuzz/corpus/{safetensors,config,tokenizer,dump}/
(docs/fuzzing.md). Run once from the repository root after changing a format; the output is
committed. Seeds stay small (a few KB): the tiny model of fuzz/fuzz_util.c (keep the two in
step), a cut-down copy of the bundled TinyStories tokenizer, and dumps written by the fuzz_dump
target itself (MKV_FUZZ_SAMPLE_DUMP), so they always match the current dump format.

usage: fuzz/make_seeds.py [BUILD_FUZZ_DIR]   (default build-fuzz; scripts/fuzz.sh builds it)
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
TINYSTORIES = os.path.join(ROOT, "..", "shared", "models", "tinystories-656k")

# The tiny model of fuzz_util.c: name, dtype, shape.
TINY = [
    ("model.embed_tokens.weight", "F16", [16, 8]),
    ("lm_head.weight", "BF16", [16, 8]),
    ("model.norm.weight", "F32", [8]),
    ("model.layers.0.input_layernorm.weight", "F32", [8]),
    ("model.layers.0.self_attn.q_proj.weight", "F32", [8, 8]),
    ("model.layers.0.self_attn.k_proj.weight", "F16", [4, 8]),
    ("model.layers.0.self_attn.v_proj.weight", "BF16", [4, 8]),
    ("model.layers.0.self_attn.o_proj.weight", "F32", [8, 8]),
    ("model.layers.0.post_attention_layernorm.weight", "F32", [8]),
    ("model.layers.0.mlp.gate_proj.weight", "F32", [8, 8]),
    ("model.layers.0.mlp.up_proj.weight", "BF16", [8, 8]),
    ("model.layers.0.mlp.down_proj.weight", "F16", [8, 8]),
]
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8,
    "vocab_size": 16, "max_position_embeddings": 32, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": None,
}


def write(sub, name, data):
    os.makedirs(os.path.join(CORPUS, sub), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(CORPUS, sub, name), "wb") as f:
        f.write(data)


def safetensors(tensors, pad=8, metadata=True):
    """tensors: (name, dtype, shape); pad: header alignment (1: none, F32 data unaligned)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {"format": "pt"}
    for i, (name, dtype, shape) in enumerate(tensors):
        n = 1
        for s in shape:
            n *= s
        if dtype == "F32":
            blob = struct.pack("<%df" % n, *[0.125 + 0.01 * ((i + k) % 9) for k in range(n)])
        elif dtype == "F16":
            blob = struct.pack("<%de" % n, *[0.25 - 0.01 * ((i + k) % 7) for k in range(n)])
        else:  # BF16: the top half of the F32 bits
            f32 = struct.pack("<%df" % n, *[0.5 + 0.01 * ((i + k) % 5) for k in range(n)])
            blob = b"".join(f32[4 * k + 2:4 * k + 4] for k in range(n))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    while len(h) % pad:
        h += b" "
    if pad == 1 and len(h) % 4 == 0:
        h += b" "
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def seeds_safetensors():
    write("safetensors", "tiny.safetensors", safetensors(TINY))
    write("safetensors", "tiny_unaligned.safetensors", safetensors(TINY, pad=1, metadata=False))
    f32 = [(n, "F32", s) for n, _, s in TINY]
    write("safetensors", "tiny_f32.safetensors", safetensors(f32))
    # Refusals: a bias, an unsupported dtype, a shape that disagrees with the config.
    write("safetensors", "bias.safetensors",
          safetensors(TINY + [("model.layers.0.self_attn.q_proj.bias", "F32", [8])]))
    odd = [(n, "I8" if i == 3 else d, s) for i, (n, d, s) in enumerate(TINY)]
    write("safetensors", "int8.safetensors", safetensors(odd))
    write("safetensors", "header_only.safetensors", safetensors([]))


def seeds_config():
    write("config", "tiny.json", json.dumps(TINY_CONFIG, indent=1))
    tied = dict(TINY_CONFIG, tie_word_embeddings=True, eos_token_id=[2, 3], head_dim=4)
    write("config", "tiny_tied.json", json.dumps(tied))
    mistral = dict(TINY_CONFIG, architectures=["MistralForCausalLM"], sliding_window=16,
                   use_sliding_window=False, bos_token_id=None)
    write("config", "tiny_mistral.json", json.dumps(mistral))
    qwen = dict(TINY_CONFIG, architectures=["Qwen2ForCausalLM"], attention_bias=False,
                rope_scaling={"rope_type": "linear", "factor": 2.0})
    write("config", "qwen_rope_scaling.json", json.dumps(qwen))
    with open(os.path.join(TINYSTORIES, "config.json"), "rb") as f:
        write("config", "tinystories.json", f.read())


def seeds_tokenizer():
    with open(os.path.join(TINYSTORIES, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    # The specials, the first single characters, some byte-fallback tokens, and the merges
    # whose parts and result all stay: a consistent BPE of a few KB.
    keep = {t: i for t, i in vocab.items() if i < 90 or t.startswith("<0x4") or t.startswith("<0xE")}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in keep and b in keep and len(merges) < 60:
            keep.setdefault(a + b, len(keep) + 1000)
            merges.append(m)
    ids = sorted(set(keep.values()))
    remap = {old: new for new, old in enumerate(ids)}
    tok["model"]["vocab"] = {t: remap[i] for t, i in sorted(keep.items(), key=lambda kv: kv[1])}
    tok["model"]["merges"] = merges
    write("tokenizer", "tinystories_small.json", json.dumps(tok, ensure_ascii=False))
    plain = dict(tok, normalizer=None, decoder=None, added_tokens=[])
    plain["model"] = dict(tok["model"], byte_fallback=False, fuse_unk=False, unk_token=None)
    write("tokenizer", "no_normalizer.json", json.dumps(plain, ensure_ascii=False))
    unnorm = json.loads(json.dumps(tok))
    for t in unnorm["added_tokens"]:
        t["normalized"] = False
    unnorm["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in merges]
    write("tokenizer", "tuple_merges_raw_added.json", json.dumps(unnorm, ensure_ascii=False))


def seeds_dump(build):
    tmp = os.path.join(CORPUS, "dump", "sample.json")
    os.makedirs(os.path.dirname(tmp), exist_ok=True)
    env = dict(os.environ, MKV_FUZZ_SAMPLE_DUMP=tmp)
    subprocess.run([os.path.join(build, "fuzz", "fuzz_dump")], env=env, check=True)
    with open(tmp) as f:
        d = json.load(f)
    # Violations for `mixkv inspect` to report: a page in two places, a missing page, bad counts.
    bad = json.loads(json.dumps(d))
    bad["ring"]["free"][0] = bad["rows"][0]["hi"][0]
    bad["rows"][-1]["n_hi"] += 9
    bad["slots"][0]["reserved_pages"] += 1
    write("dump", "violations.json", json.dumps(bad, indent=1))
    empty = dict(d, slots=[], rows=[], reserved_pages=0)
    n = d["config"]["pool_pages"]
    empty["ring"] = {"head": 3, "tail": 3 + n, "free_pages": n, "free": list(range(n))}
    write("dump", "empty.json", json.dumps(empty))


def dictionaries():
    words = {
        "safetensors": ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"',
                        '"F16"', '"BF16"', '"I8"', '"model.layers.0."', '".weight"', '".bias"'],
        "config": ['"architectures"', '"LlamaForCausalLM"', '"MistralForCausalLM"',
                   '"Qwen2ForCausalLM"', '"head_dim"', '"sliding_window"', '"use_sliding_window"',
                   '"rope_scaling"', '"rope_type"', '"hidden_act"', '"silu"', '"attention_bias"',
                   '"mlp_bias"', '"tie_word_embeddings"', '"bos_token_id"', '"eos_token_id"',
                   '"num_key_value_heads"', '"max_position_embeddings"', '"2147483647"', '"1e308"'],
        "tokenizer": ['"BPE"', '"ByteFallback"', '"Fuse"', '"Prepend"', '"Regex"', '"Replace"',
                      '"Sequence"', '"Strip"', '"String"', '"TemplateProcessing"',
                      '"SpecialToken"', '"added_tokens"', '"normalized"', '"special"',
                      '"byte_fallback"', '"fuse_unk"', '"unk_token"', '"merges"', '"vocab"',
                      '"normalizers"', '"decoders"', '"pattern"', '"content"', '"prepend"',
                      '"<0x41>"', '"<0xE2>"', '"\\xe2\\x96\\x81"', '"continuing_subword_prefix"',
                      '"end_of_word_suffix"', '"ignore_merges"', '"lstrip"', '"rstrip"'],
        "dump": ['"mixkv-cache-dump"', '"version"', '"mixkv_version"', '"config"', '"layout"',
                 '"ring"', '"free"', '"free_pages"', '"reserved_pages"', '"slots"', '"rows"',
                 '"seq_len"', '"n_hi"', '"n_lo"', '"hi"', '"lo"', '"tokens_per_page_hi"',
                 '"tokens_per_page_lo"', '"row_entries"', '"K16V16"', '"K8V4"', '"K4V2"',
                 '"K2V4"', '"cuda"', '"cpu"', '"pool_pages"', '"page_bytes"', '"max_seqs"',
                 '"max_seq_len"', '"flags"', '"2147483647"', '"-2147483648"',
                 '"9007199254740992"'],
    }
    for name, ws in words.items():
        with open(os.path.join(ROOT, "fuzz", name + ".dict"), "w") as f:
            f.write("# libFuzzer dictionary of fuzz_%s (written by fuzz/make_seeds.py)\n" % name)
            f.writelines(w + "\n" for w in ws)


if __name__ == "__main__":
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build-fuzz")
    seeds_safetensors()
    seeds_config()
    seeds_tokenizer()
    seeds_dump(build)
    dictionaries()
