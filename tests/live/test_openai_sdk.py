"""The official openai SDK against the server: completions and chat, streaming and not."""

import openai
import pytest

from conftest import FIXED, Server, client


def test_models_lists_the_served_model(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["servesim-model"]


def test_completion(server):
    r = client(server).completions.create(model="servesim-model", prompt="Say something", max_tokens=7)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == "servesim-model" and r.created > 1_600_000_000
    c = r.choices[0]
    assert c.finish_reason == "length" and c.index == 0
    assert len(c.text.split()) == 7, "the approximate tokenizer decodes each token to one word"
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens == 4  # " Say" " some" "thin" "g"
    assert r.usage.total_tokens == 11
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_completion_stream_with_usage(server):
    stream = client(server).completions.create(
        model="servesim-model", prompt=[5, 6, 7, 8], max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(texts) == 12 and all(t.strip() for t in texts)
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 4
    assert len({c.id for c in chunks}) == 1


def test_chat(server):
    r = client(server).chat.completions.create(
        model="servesim-model", messages=[{"role": "user", "content": "Hello!"}], max_tokens=5
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    m = r.choices[0].message
    assert m.role == "assistant" and len(m.content.split()) == 5
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_chat_stream(server):
    stream = client(server).chat.completions.create(
        model="servesim-model",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_completion_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 6


def test_chat_stream_without_usage_has_no_usage_chunk(server):
    chunks = list(
        client(server).chat.completions.create(
            model="servesim-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_what_real_clients_send_is_accepted(server):
    r = client(server).chat.completions.create(
        model="servesim-model",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=4,
        temperature=0.7,
        top_p=0.9,
        seed=1,
        stop=["\n"],
        n=1,
        presence_penalty=0.1,
        extra_body={"min_tokens": 4, "ignore_eos": True, "top_k": 5, "nvext": {"ignore_eos": True}},
    )
    assert r.usage.completion_tokens == 4


def test_cached_tokens_reported_for_a_repeated_prompt(server):
    prompt = list(range(1000, 1100))  # 100 tokens: 6 full blocks of 16
    c = client(server)
    first = c.completions.create(model="servesim-model", prompt=prompt, max_tokens=2)
    second = c.completions.create(model="servesim-model", prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 96


def test_sdk_errors(server):
    c = client(server)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="other-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="servesim-model", prompt="x", max_tokens=10**9)
    assert "maximum context length" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="servesim-model", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="servesim-model", prompt="x", max_tokens=2, n=2)


def test_chat_without_max_tokens_runs_to_the_context_length():
    with Server("--speedup-ratio", "0", "--max-model-len", "64", engine={"timing_model": FIXED, "block_size": 16}) as s:
        r = client(s).chat.completions.create(model="servesim-model", messages=[{"role": "user", "content": "Hi"}])
        assert r.usage.total_tokens == 64
        r = client(s).completions.create(model="servesim-model", prompt="Hi")
        assert r.usage.completion_tokens == 16, "completions default to 16 tokens"
