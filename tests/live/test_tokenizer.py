"""A model directory with a real tokenizer.json (trained here with the `tokenizers` package) and
a chat template: token counts, rendering and generated text follow the model's files."""

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, trainers

from conftest import Server, client

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'].strip() }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|bos|>", "<|eos|>", "<think>", "</think>"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly boxers".split()
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 0)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "bos_token": {"content": "<|bos|>"}, "eos_token": "<|eos|>"})
    )
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "max_position_embeddings": 2048}))
    return d


@pytest.fixture(scope="module")
def tiny(model_dir):
    with Server("--speedup-ratio", "0", "--model-path", model_dir, engine={"block_size": 16}) as s:
        yield s


def test_model_name_and_context_come_from_the_directory(tiny, model_dir):
    m = client(tiny).models.list().data[0]
    assert m.id == model_dir.name
    assert m.model_extra["max_model_len"] == 2048


def test_completion_counts_with_the_real_tokenizer(tiny, model_dir):
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "the lazy dog jumps over seven jolly wizards"
    r = client(tiny).completions.create(model=model_dir.name, prompt=text, max_tokens=30)
    expected = tok.encode(text).ids
    assert expected[0] == 0, "the post-processor adds BOS"
    assert r.usage.prompt_tokens == len(expected)
    out = r.choices[0].text
    assert out and "\ufffd" not in out and not any(s in out for s in SPECIAL)
    # The text re-encodes to about as many tokens as were generated (never special tokens).
    ids = tok.encode(out, add_special_tokens=False).ids
    assert all(i >= len(SPECIAL) for i in ids)


def test_chat_uses_the_template(tiny, model_dir):
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    messages = [{"role": "system", "content": "  be quick "}, {"role": "user", "content": "the brown fox"}]
    rendered = "<|bos|><|system|>be quick\n<|user|>the brown fox\n<|assistant|>"
    r = client(tiny).chat.completions.create(model=model_dir.name, messages=messages, max_tokens=5)
    assert r.usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False).ids)
    stream = client(tiny).chat.completions.create(model=model_dir.name, messages=messages, max_tokens=8, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) == 8 and all(p and "\ufffd" not in p for p in pieces)


def test_template_errors_are_bad_requests(tiny, model_dir):
    with pytest.raises(openai.BadRequestError) as e:
        client(tiny).chat.completions.create(model=model_dir.name, messages=[{"role": "tool", "content": "x"}], max_tokens=2)
    assert "unknown role tool" in str(e.value)


def test_reasoning_boundaries_use_the_configured_ids(model_dir):
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    think, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    reasoning = json.dumps({"start_thinking_token_id": think, "end_thinking_token_id": end, "thinking_ratio": 0.5})
    with Server("--speedup-ratio", "0", "--model-path", model_dir, "--reasoning", reasoning) as s:
        stream = client(s).completions.create(model=model_dir.name, prompt="the fox", max_tokens=10, stream=True)
        pieces = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
        assert pieces[0] == "<think>" and pieces[4] == "</think>"


def test_sentencepiece_style_words_keep_their_spaces_when_streamed(tmp_path):
    # Metaspace tokenizers (Llama-2, Mistral, Gemma) drop the leading space of a sequence's
    # first token; a generated token never starts a sequence, so its space must survive.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly boxers".split()
    corpus = [" ".join(words[(i * 5 + j) % len(words)] for j in range(10)) for i in range(300)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["<s>", "</s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    with Server("--speedup-ratio", "0", "--model-path", tmp_path) as s:
        c = client(s)
        stream = c.completions.create(model=tmp_path.name, prompt="the fox", max_tokens=40, stream=True)
        pieces = [ch.choices[0].text for ch in stream if ch.choices and ch.choices[0].text]
        assert len(pieces) == 40
        streamed = "".join(pieces)
        assert len(streamed.split()) > 3, f"words run together: {streamed!r}"
        assert "\u2581" not in streamed, "the Metaspace marker is decoded to a space"
        # Every piece is the token's text after other text: a word-initial piece leads with a
        # space, exactly as the tokenizer decodes it inside a sequence.
        anchor = tok.decode([2])
        vocab_pieces = {tok.decode([2, i]).removeprefix(anchor) for i in range(2, tok.get_vocab_size())}
        assert set(pieces) <= vocab_pieces
        text = c.completions.create(model=tmp_path.name, prompt="the fox", max_tokens=40).choices[0].text
        assert len(text.split()) > 3 and "\u2581" not in text


def test_tools_and_chat_template_kwargs_reach_the_template(model_dir, tmp_path):
    # vLLM passes `tools`, `add_generation_prompt` and `chat_template_kwargs` to the template.
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    template = (
        "{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }} {% endfor %}|\n{% endif %}"
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    messages = [{"role": "user", "content": "the brown fox"}]
    tools = [{"type": "function", "function": {"name": "jumps", "parameters": {}}}]

    def count(text):
        return len(tok.encode(text, add_special_tokens=False).ids)

    with Server("--speedup-ratio", "0", "--model-path", tmp_path) as s:
        c = client(s)

        def prompt_tokens(**extra):
            return c.chat.completions.create(model=tmp_path.name, messages=messages, max_tokens=1, **extra).usage.prompt_tokens

        assert prompt_tokens() == count("<|user|>the brown fox\n<|assistant|>")
        assert prompt_tokens(tools=tools) == count("<|tools|>jumps |\n<|user|>the brown fox\n<|assistant|>")
        no_think = prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert no_think == count("<|user|>the brown fox\n<|assistant|><think></think>")
        assert prompt_tokens(extra_body={"add_generation_prompt": False}) == count("<|user|>the brown fox\n")
        with pytest.raises(openai.BadRequestError):
            prompt_tokens(extra_body={"chat_template_kwargs": "yes"})


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmHWM:"))


def post_raw(srv, path, body):
    req = urllib.request.Request(srv.url + path, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_huge_prompts_are_refused_in_bounded_memory(model_dir):
    # N4: the whole prompt was tokenized before the context check; the tokenizers crate needs
    # ~150 bytes per byte of text, so one 31 MB message took 4.8 GB and 4 at once 17.5 GB.
    # Now a large text is counted 64 KiB at a time and refused once it is over the limit.
    words = (32 * 1024 * 1024 - 200) // 5
    chat = json.dumps({"messages": [{"role": "user", "content": "word " * words}], "max_tokens": 1}).encode()
    completion = json.dumps({"prompt": "word " * words, "max_tokens": 1}).encode()
    assert len(chat) > 32_000_000 and len(completion) > 32_000_000
    with Server("--speedup-ratio", "0", "--model-path", model_dir) as s:
        jobs = [("/v1/chat/completions", chat)] * 4 + [("/v1/completions", completion)] * 4
        results = [None] * len(jobs)

        def run(i):
            results[i] = post_raw(s, *jobs[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = peak_rss_mb(s.proc.pid)
        for (path, _), (code, payload) in zip(jobs, results):
            assert code == 400, payload
            err = payload["error"]
            assert err["param"] == ("messages" if "chat" in path else "prompt"), err
            assert err["message"].startswith("This model's maximum context length is 2048 tokens. However, your request has at least "), err
        assert peak < 1024, f"peak RSS {peak:.0f} MB for 8 concurrent 32 MiB prompts"


def test_prompts_past_the_whole_text_size_within_the_limit_count_exactly(model_dir):
    # Texts over 256 KiB are counted in pieces first; one within the context limit must still
    # get exactly the whole text's tokens, as before.
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    words = "the quick brown fox jumps over a lazy dog, while seven wizards quietly hex jolly boxers.\n".split(" ")
    text = " ".join(words[(i * 7) % len(words)] for i in range(60_000))
    assert len(text) > 300 * 1024
    expected = len(tok.encode(text).ids)
    rendered = "<|bos|><|user|>" + text.strip() + "\n<|assistant|>"
    expected_chat = len(tok.encode(rendered, add_special_tokens=False).ids)
    limit = max(expected, expected_chat) + 10
    args = ["--speedup-ratio", "0", "--model-path", model_dir, "--max-model-len", limit,
            "--num-gpu-blocks-override", limit // 16 + 100]
    with Server(*args, engine={"block_size": 16}) as s:
        r = client(s).completions.create(model=model_dir.name, prompt=text, max_tokens=1)
        assert r.usage.prompt_tokens == expected
        r = client(s).chat.completions.create(model=model_dir.name, messages=[{"role": "user", "content": text}], max_tokens=1)
        assert r.usage.prompt_tokens == expected_chat
        # A little over the limit: refused with the exact count (the pieces' count less the
        # slack per cut is under the limit, so the text is counted whole).
        over = text + " fox" * 12
        exact = len(tok.encode("<|bos|><|user|>" + over.strip() + "\n<|assistant|>", add_special_tokens=False).ids)
        assert limit <= exact < limit + 20
        body = {"messages": [{"role": "user", "content": over}], "max_tokens": 1}
        code, payload = post_raw(s, "/v1/chat/completions", json.dumps(body).encode())
        assert code == 400 and f"However, your request has {exact} input tokens." in payload["error"]["message"], payload
