#!/usr/bin/env python3
"""gen_tokenizer_fixtures.py — writes the byte-level BPE fixtures of tests/cpu/test_tokenizer_bpe.c.

The oracle is Hugging Face `tokenizers` (pip install tokenizers gguf numpy); the C tests read only
the files written here, never Python. Deterministic (fixed seeds); run from the repository root:

    python3 scripts/gen_tokenizer_fixtures.py [--shared ../shared] [--gguf models/...gguf]

Writes, under tests/fixtures/:
  tokenizer_{llama3,qwen2,gpt2,splits}/tokenizer.json  small vocabularies (2,000 tokens) trained
      on the essays with the pre-tokenizer / normalizer of Llama 3, Qwen2, GPT-2 (add_prefix_space
      on) and a chain of every Split behaviour;
  tokenizer_*/cases.json  texts with HF's ids (without and with the post-processor's BOS) and
      decodings (with and without skip_special_tokens);
  tokenizer_smollm2/cases.json  the same for SmolLM2-135M's tokenizer, rebuilt from its GGUF.
"""
import argparse
import json
import os
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pt
from tokenizers import processors, trainers

RE_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
            r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

HAND = [
    "", " ", "  ", "\n", "\n\n\n", "\r\n", "\t\tx", "a", "Hello, world!", " leading space",
    "trailing space ", "two  spaces   three", "I'm sure you're right, they'll see it'd work.",
    "DON'T SHOUT, WE'RE FINE, IT'S OK", "She'S 'll 'VE", "12345678 3.14159 -42 1,000,000 2024-05-01",
    "x=1+2*3; y==4 && z!=5 || w>=6", "def f(x):\n    return x**2\n", "café naïve résumé",
    "cafe\u0301 nai\u0308ve", "日本語のテキスト、句読点。", "中文和English混合123",
    "emoji 😀👍🏽 👩‍💻 🇫🇷", "Ünïcödé ßtraße", "١٢٣ ٤٥ ０１２ ²½", "tabs\tand\u00a0nbsp\u3000ideographic",
    "a\u2003em space", "... !!! ??? ---", "'quoted' \"double\" «guillemets»", "line1\nline2\n\nline4",
    "   \n   \n", "hello\n\n\nworld  \n",
]


def specials_of(name):
    return {
        "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"],
        "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "gpt2": ["<|endoftext|>"],
        "splits": ["<s>", "</s>"],
    }[name]


def random_text(rng, specials):
    pools = [
        lambda: rng.choice(["the", "The", "quick", "brown", "FOX", "jumps", "over", "lazy", "dog",
                            "Startup", "essay", "hackers"]),
        lambda: rng.choice(["'s", "'t", "'re", "'VE", "'m", "'ll", "'D", "n't"]),
        lambda: "".join(rng.choice(".,;:!?()[]{}<>@#$%^&*-_=+/\\|~`\"'") for _ in range(rng.randint(1, 4))),
        lambda: "".join(chr(rng.randint(0xC0, 0xFF)) for _ in range(rng.randint(1, 5))),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(rng.randint(1, 6))),
        lambda: "".join(chr(rng.randint(0x3041, 0x3096)) for _ in range(rng.randint(1, 4))),
        lambda: rng.choice(["😀", "😂", "👍", "👍🏽", "👩‍💻", "🚀", "❤️", "🇯🇵", "🙏"]),
        lambda: rng.choice("aeiouAEIO") + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 3))),
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9))),
        lambda: rng.choice(["٣", "٤٥", "０９", "²", "½", "Ⅻ", "७"]),
        lambda: rng.choice([" ", "  ", "   ", "\n", "\n\n", "\t", " \t ", "\r\n", "\u00a0",
                            "\u3000", "\u2003", "     "]),
        lambda: rng.choice(specials),
    ]
    return "".join(rng.choice(pools)() for _ in range(rng.randint(1, 24)))


def real_snippets(shared, rng, count):
    out = []
    essays = os.path.join(shared, "data", "essays")
    files = sorted(f for f in os.listdir(essays) if f.endswith(".txt") and not f.startswith("LICENSE"))
    files.append(os.path.join("..", "tinystories", "tinystories_val_dev.txt"))
    for i in range(count):
        with open(os.path.join(essays, files[i % len(files)]), encoding="utf-8") as f:
            text = f.read()
        start = rng.randrange(0, max(1, len(text) - 400))
        out.append(text[start:start + rng.randint(40, 400)])
    return out


def essays_corpus(shared):
    essays = os.path.join(shared, "data", "essays")
    for f in sorted(os.listdir(essays)):
        if f.endswith(".txt") and not f.startswith("LICENSE"):
            with open(os.path.join(essays, f), encoding="utf-8") as fh:
                yield fh.read()


def build_trained(name, shared, vocab_size=2000):
    specials = specials_of(name)
    tok = Tokenizer(models.BPE(ignore_merges=(name == "llama3")))
    if name == "llama3":
        tok.pre_tokenizer = pt.Sequence([
            pt.Split(Regex(RE_LLAMA3), behavior="isolated", invert=False),
            pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    elif name == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pt.Sequence([
            pt.Split(Regex(RE_QWEN2), behavior="isolated", invert=False),
            pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    elif name == "gpt2":
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=True, use_regex=True)
    else:  # every Split behaviour, a literal pattern, invert, Digits in runs, prefix space
        tok.pre_tokenizer = pt.Sequence([
            pt.Split(Regex(r"[.,;:!?]"), behavior="merged_with_previous"),
            pt.Split(" ", behavior="merged_with_next"),
            pt.Split(Regex(r"\t+"), behavior="removed"),
            pt.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True),
            pt.Digits(individual_digits=False),
            pt.ByteLevel(add_prefix_space=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pt.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(essays_corpus(shared), trainer)
    if name == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    elif name == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def build_smollm2(path):
    import gguf
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pt.Sequence([pt.Digits(individual_digits=True),
                                     pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok, [t for t, ty in zip(tokens, types) if ty == 3]


def cases_for(tok, texts, bos_text=None):
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        c = {"text": t, "ids": ids,
             "decoded": tok.decode(ids, skip_special_tokens=False),
             "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
        if bos_text is not None and not t.startswith(bos_text):
            c["ids_bos"] = tok.encode(t, add_special_tokens=True).ids
        cases.append(c)
    return cases


def write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=0)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--gguf", default="models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/fixtures")
    a = ap.parse_args()
    import tokenizers
    for name in ["llama3", "qwen2", "gpt2", "splits"]:
        rng = random.Random("mixkv-" + name)
        tok = build_trained(name, a.shared)
        texts = HAND + real_snippets(a.shared, rng, 24) + [random_text(rng, specials_of(name))
                                                            for _ in range(60)]
        sp = specials_of(name)
        texts += [sp[-1] + "x" + sp[0] + " y " + sp[-1], "a" + sp[0] + sp[0] + "b"]
        d = os.path.join(a.out, "tokenizer_" + name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        write(os.path.join(d, "cases.json"),
              {"oracle": "tokenizers " + tokenizers.__version__, "bos": tok.token_to_id(sp[0])
               if name == "llama3" else -1,
               "cases": cases_for(tok, texts, sp[0] if name == "llama3" else None)})
        print(name, tok.get_vocab_size(), len(texts))
    if os.path.exists(a.gguf):
        rng = random.Random("mixkv-smollm2")
        tok, specials = build_smollm2(a.gguf)
        readme = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        texts = [readme] + HAND + real_snippets(a.shared, rng, 24) + \
            [random_text(rng, specials[:3]) for _ in range(60)]
        ids = tok.encode(readme, add_special_tokens=False).ids
        assert ids == [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198], ids
        write(os.path.join(a.out, "tokenizer_smollm2", "cases.json"),
              {"oracle": "tokenizers " + tokenizers.__version__, "bos": 1,
               "cases": cases_for(tok, texts)})
        print("smollm2", tok.get_vocab_size(), len(texts))


if __name__ == "__main__":
    main()
