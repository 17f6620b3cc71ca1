"""DeepSeek-V4 under context parallelism: a tiny random model, the per-document oracle, and the
rank tasks that compare the two (test_deepseek_v4.py).

The oracle is the unmodified transformers model run on each document alone (transformers
attends across a packed row, so the packed single-process run is not the reference): logits,
the mean next-token loss over the batch, every parameter gradient, and each CSA layer's indexer
ids (captured from ``DeepseekV4Indexer.forward``).
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import model_tasks
import torch
import torch.distributed as dist

VOCAB = 97


def tiny_config(**overrides: Any) -> Any:
    """Sliding, CSA (ratio 4, two layers) and HCA (ratio 8) layers; 8 index heads so that exact
    score ties (every head's ReLU at 0) are rare; top-k 3."""
    from transformers import DeepseekV4Config

    settings: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=4,
        n_shared_experts=1,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=6, o_groups=2, o_lora_rank=16,
        index_n_heads=8, index_head_dim=16, index_topk=3, hc_mult=2, hc_sinkhorn_iters=3,
        max_position_embeddings=4096, partial_rotary_factor=0.25, attn_implementation="eager",
        experts_implementation="eager")
    settings.update(overrides)
    return DeepseekV4Config(**settings)


def tiny_model(dtype: torch.dtype = torch.float64, seed: int = 0, **overrides: Any) -> Any:
    """A random tiny DeepseekV4ForCausalLM, identical for the same seed on every rank. Sinks,
    position biases and the hash table get random values (the model initialises them to 0)."""
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    bias = lambda t, g: torch.randn(t.shape, generator=g) * 0.5  # noqa: E731
    model = model_tasks.randomized(DeepseekV4ForCausalLM(config), seed, {"sinks": bias, "position_bias": bias},
                                   {"tid2eid": lambda t, g: torch.randint(0, config.n_routed_experts, t.shape,
                                                                          generator=g)})
    return model.to(dtype)


def packed_ids(lengths: tuple[int, ...], seed: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, sum(lengths)), generator=generator)


def _capture_indexer_ids(model: Any) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], list[Any]]:
    """Per CSA layer, the ids each indexer forward returned and its scores [S, T] (one entry per
    document run)."""
    captured: list[list[torch.Tensor]] = []
    scores: list[list[torch.Tensor]] = []
    handles = []
    for layer in model.model.layers:
        compressor = layer.self_attn.compressor
        if compressor is not None and hasattr(compressor, "indexer"):
            store: list[torch.Tensor] = []
            seen: list[torch.Tensor] = []
            captured.append(store)
            scores.append(seen)
            handles.append(compressor.indexer.register_forward_hook(
                lambda module, args, output, store=store: store.append(output[0].clone())))
            handles.append(compressor.indexer.scorer.register_forward_hook(
                lambda module, args, output, seen=seen: seen.append(output[0].detach().clone())))
    return captured, scores, handles


# The per-document oracle with this model's capture, and one rank's CP run(s) of this model.
per_document_oracle = functools.partial(model_tasks.per_document_oracle, _capture_indexer_ids)
cp_run = functools.partial(model_tasks.cp_run, kind="v4")
cp_runs = functools.partial(model_tasks.cp_runs, kind="v4")


def kl_reference(model: Any, input_ids: torch.Tensor, lengths: tuple[int, ...], coeff: float) -> float:
    """The indexer KL of the per-document run, by the formula in plain torch (float64 loops):
    per CSA layer and row t with selected ids S_t (the model's own indexer's), teacher p = the
    main attention's per-head softmax over [scale * q . K[s] for s in S_t] + [sink], sink dropped,
    summed over heads, L1-normalised; student = log_softmax over S_t of
    sum_h w[h] * ReLU(qi[h] . Ki[s]); loss = coeff / S * sum_t sum_s p (log p - log_student)."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb as rope

    model = copy.deepcopy(model)
    total = 0.0
    documents = model_tasks.attention_inputs_per_document(model, input_ids, lengths, model_tasks.is_csa)
    for length, index, hidden, position_ids, embeddings in documents:
        attention = model.model.layers[index].self_attn
        compressor, indexer = attention.compressor, attention.compressor.indexer
        cos, sin = embeddings["compress"]
        q_residual = attention.q_a_norm(attention.q_a_proj(hidden))
        q = attention.q_b_proj(q_residual).view(1, length, -1, attention.head_dim).transpose(1, 2)
        q = rope(attention.q_b_norm(q), cos, sin)[0]  # [H, S, D]
        bank, _ = compressor(hidden, q_residual, position_ids, None, index)
        selected = indexer(hidden, q_residual, position_ids, None, index)[0]  # [S, k]
        index_keys = _index_bank(indexer, hidden, rope)  # [T, Di]
        icos, isin = indexer.rotary_emb(hidden, position_ids=position_ids, layer_type="compress")
        qi = indexer.q_b_proj(q_residual).view(1, length, -1, indexer.head_dim).transpose(1, 2)
        qi = rope(qi, icos, isin).transpose(1, 2)[0]  # [S, Hi, Di]
        w = indexer.scorer.weights_proj(hidden)[0] * indexer.scorer.weights_scaling \
            * indexer.scorer.softmax_scale
        for t in range(length):
            chosen = [int(s) for s in selected[t].tolist() if s >= 0]
            if not chosen:
                continue
            keys = bank[0, 0, chosen]  # [n, D]
            logits = torch.cat([q[:, t] @ keys.T * attention.scaling, attention.sinks[:, None]], dim=1)
            mass = torch.softmax(logits, dim=1)[:, :-1].sum(0)
            p = mass / mass.sum().clamp_min(torch.finfo(torch.float32).tiny)
            scores = (w[t][:, None] * torch.relu(qi[t] @ index_keys[chosen].T)).sum(0)
            log_student = torch.log_softmax(scores, dim=0)
            total += float((p * (torch.log(p.clamp_min(torch.finfo(torch.float32).tiny)) - log_student)).sum())
    return coeff * total / sum(lengths)


def _index_bank(indexer: Any, hidden: torch.Tensor, rope: Any) -> torch.Tensor:
    """The indexer's compressed keys of one document, as DeepseekV4Indexer.forward computes them."""
    m, d = indexer.compress_rate, indexer.head_dim
    windows = hidden.shape[1] // m
    kv = indexer.kv_proj(hidden)[0, :windows * m].view(windows, m, 2 * d)
    gate = indexer.gate_proj(hidden)[0, :windows * m].view(windows, m, 2 * d) + indexer.position_bias
    slots_kv = torch.zeros((windows, 2 * m, d), dtype=kv.dtype)
    slots_gate = torch.full((windows, 2 * m, d), float("-inf"), dtype=gate.dtype)
    slots_kv[:, m:], slots_gate[:, m:] = kv[..., d:], gate[..., d:]
    slots_kv[1:, :m], slots_gate[1:, :m] = kv[:-1, :, :d], gate[:-1, :, :d]
    entries = indexer.kv_norm((slots_kv * slots_gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(1))
    positions = (torch.arange(windows) * m)[None]
    cos, sin = indexer.rotary_emb(entries[None], position_ids=positions, layer_type="compress")
    return rope(entries[None, None], cos, sin)[0, 0]


def run_doc_snippets(rank: int, size: int, readme: list[str], guide: list[str]) -> dict[str, Any]:
    """The README's DeepSeek-V4 section, then the guide page's blocks, each in a fresh namespace."""
    from sparsecp.models import deepseek_v4 as cp_v4

    first: dict[str, Any] = {"__name__": "readme"}
    for index, block in enumerate(readme):
        exec(compile(block, f"README.md DeepSeek-V4 snippet {index + 1}", "exec"), first)  # noqa: S102
    second: dict[str, Any] = {"__name__": "guide"}
    for index, block in enumerate(guide):
        exec(compile(block, f"docs/guide/deepseek-v4.md snippet {index + 1}", "exec"), second)  # noqa: S102
    state = cp_v4.context_parallel_state(second["model"])
    assert state is not None
    indexer_grads = [p.grad for n, p in second["model"].named_parameters() if ".indexer." in n]
    return {"logits": tuple(first["logits"].shape), "loss": float(first["loss"].detach()),
            "indexer_grad": all(g is not None for g in indexer_grads),
            "replays": state.stats.replays, "selections": state.stats.selections}


def misuse_runs(rank: int, size: int) -> dict[str, Any]:
    """Uses that used to fail or mislead (issue 35): nine micro-batches of different lengths
    under checkpointing before one backward; the KL read after an evaluation forward; reentrant
    checkpointing with the KL; document_lengths as a generator."""
    from sparsecp.models import deepseek_v4 as cp_v4

    out: dict[str, Any] = {}
    batches = [(13, 17, 11, 7), (48,), (1,) * 8 + (40,), (20, 28), (3, 3, 3, 3, 36), (7, 41), (30, 18), (2, 46),
               (24, 24)]
    grads = []
    for together in (False, True):
        model = tiny_model(torch.float64)
        model.activation_checkpointing_enable()
        cp_v4.context_parallel(model, None, "spill")
        losses = []
        for index, lengths in enumerate(batches):
            input_ids = packed_ids(lengths, seed=index)
            ids, positions = cp_v4.shard_batch(input_ids, lengths)
            logits = model(input_ids=ids, position_ids=positions, document_lengths=lengths).logits
            loss = cp_v4.causal_lm_loss(logits, cp_v4.shard_labels(input_ids, lengths), lengths)
            if together:
                losses.append(loss)
            else:
                loss.backward()
        if together:
            torch.stack(losses).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    out["nine micro-batches"] = max(float((grads[1][n] - g).abs().max()) / max(float(g.abs().max()), 1e-12)
                                    for n, g in grads[0].items())

    lengths = (13, 17, 11, 7)
    input_ids = packed_ids(lengths)
    model = tiny_model(torch.float64)
    cp_v4.context_parallel(model, None, "spill", indexer_kl_coeff=0.5)
    ids, positions = cp_v4.shard_batch(input_ids, lengths)
    model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    first = float(cp_v4.indexer_kl_loss(model).detach())
    with torch.no_grad():
        model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    out["kl after eval"] = (first, float(cp_v4.indexer_kl_loss(model).detach()))
    generated = model(input_ids=ids, position_ids=positions, document_lengths=(n for n in lengths)).logits
    out["generator lengths"] = float((generated - model(input_ids=ids, position_ids=positions,
                                                        document_lengths=lengths).logits).abs().max())

    model = tiny_model(torch.float64)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    cp_v4.context_parallel(model, None, "spill", indexer_kl_coeff=0.5)
    model.train()
    model(input_ids=ids, position_ids=positions, document_lengths=lengths)
    try:
        cp_v4.indexer_kl_loss(model)
        out["reentrant"] = ""
    except ValueError as error:
        out["reentrant"] = str(error)
    return out


def padding_kl(rank: int, size: int) -> dict[str, Any]:
    """The indexer KL of a batch padded with a document of its own (``pad_to_multiple``,
    ``padding_tokens=``) and of the same batch unpadded: values and indexer gradients."""
    from sparsecp.models import deepseek_v4 as cp_v4

    out = {}
    lengths = (13, 17, 11, 5)
    for padded in (False, True):
        model = tiny_model(torch.float64)
        cp_v4.context_parallel(model, None, "spill", indexer_kl_coeff=0.5)
        input_ids = packed_ids(lengths)
        batch_lengths, padding = lengths, 0
        if padded:
            input_ids, batch_lengths, _ = cp_v4.pad_to_multiple(input_ids, lengths, 4 * size)
            padding = sum(batch_lengths) - sum(lengths)
        ids, positions = cp_v4.shard_batch(input_ids, batch_lengths)
        model(input_ids=ids, position_ids=positions, document_lengths=batch_lengths, padding_tokens=padding)
        kl = cp_v4.indexer_kl_loss(model)
        kl.backward()
        summed = kl.detach().clone()
        dist.all_reduce(summed)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and ".indexer." in n}
        for grad in grads.values():
            dist.all_reduce(grad)
        out["padded" if padded else "plain"] = {"kl": float(summed), "grads": grads, "padding": padding}
    return out
