"""DeepSeek-V3.2 under context parallelism: a tiny random model, the per-document oracle, and the
rank tasks that compare the two (test_deepseek_v32.py).

The oracle is the unmodified transformers model run on each document alone (transformers
attends across a packed row, so the packed single-process run is not the reference): logits,
the mean next-token loss over the batch, every parameter gradient, and each layer's indexer ids
(``DeepseekV32Indexer.forward``'s output) with the model's scores of them.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import model_tasks
import torch

VOCAB = 97


def tiny_config(**overrides: Any) -> Any:
    """MLA (4 heads, latent 16, rope 8), a dense layer then two MoE layers; an indexer of 8 heads
    (exact score ties, every head's ReLU at 0, are rare) keeping the top 4 of every earlier token."""
    from transformers import DeepseekV32Config

    settings: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, n_group=2,
        topk_group=1, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, v_head_dim=12,
        qk_nope_head_dim=12, index_topk=4, index_head_dim=16, index_n_heads=8, first_k_dense_replace=1,
        max_position_embeddings=4096, initializer_range=0.1, experts_implementation="eager")
    settings.update(overrides)
    return DeepseekV32Config(**settings)


def tiny_model(dtype: torch.dtype = torch.float64, seed: int = 0, **overrides: Any) -> Any:
    """A random tiny DeepseekV32ForCausalLM, identical for the same seed on every rank; the
    router's score-correction bias and the norms' weights get random values (the model
    initialises them to constants)."""
    from transformers import DeepseekV32ForCausalLM

    torch.manual_seed(seed)
    norm = lambda t, g: 1 + 0.2 * torch.randn(t.shape, generator=g)  # noqa: E731
    model = model_tasks.randomized(DeepseekV32ForCausalLM(tiny_config(**overrides)), seed,
                                   {"norm.weight": norm, "layernorm.weight": norm},
                                   {"e_score_correction_bias": lambda t, g: 0.1 * torch.randn(t.shape, generator=g)})
    return model.to(dtype)


def packed_ids(lengths: tuple[int, ...], seed: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, sum(lengths)), generator=generator)


def model_scores(indexer: Any, hidden: torch.Tensor, q_resid: torch.Tensor, embeddings: Any) -> torch.Tensor:
    """[S, S] ``DeepseekV32Indexer.forward``'s index scores of one document (the model's lines,
    before its causal mask): what its top-k ranks."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    batch, rows, _ = hidden.shape
    cos, sin = embeddings
    q = indexer.wq_b(q_resid).view(batch, rows, indexer.n_heads, indexer.head_dim)
    rope = indexer.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [rope, indexer.head_dim - rope], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [rope, indexer.head_dim - rope], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q, k = torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    weights = indexer.weights_proj(hidden).float() * indexer.n_heads ** -0.5
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)[0]


def _capture_indexer(model: Any) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], list[Any]]:
    """Per layer, the ids each indexer forward returned (document-local token ids, [S, topk]) and
    the model's scores [S, S] (one entry per document run)."""
    captured: list[list[torch.Tensor]] = []
    scores: list[list[torch.Tensor]] = []
    handles = []
    for layer in model.model.layers:
        store: list[torch.Tensor] = []
        seen: list[torch.Tensor] = []
        captured.append(store)
        scores.append(seen)

        def hook(module: Any, args: tuple, kwargs: dict, output: torch.Tensor, store: list = store,
                 seen: list = seen) -> None:
            hidden, q_resid, embeddings = args[:3]
            store.append(output[0].clone())
            with torch.no_grad():
                seen.append(model_scores(module, hidden, q_resid, embeddings))

        handles.append(layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True))
    return captured, scores, handles


# The per-document oracle with this model's capture, and one rank's CP run(s) of this model.
per_document_oracle = functools.partial(model_tasks.per_document_oracle, _capture_indexer)
cp_run = functools.partial(model_tasks.cp_run, kind="v32")
cp_runs = functools.partial(model_tasks.cp_runs, kind="v32")


def kl_reference(model: Any, input_ids: torch.Tensor, lengths: tuple[int, ...], coeff: float) -> float:
    """The indexer KL of the per-document run, by the formula in plain torch (float64 loops): per
    layer and row t with selected ids S_t (the model's own indexer's, those t can see), teacher p
    = the main attention's per-head softmax over [scale * q_h . k_h(s) for s in S_t] (the model's
    expanded keys, ``expand_kv``), summed over heads, L1-normalised; student = log_softmax over
    S_t of sum_h w[h] * n^-0.5 * scale_i * ReLU(qi[h] . ki[s]); loss = coeff / S * sum_t sum_s
    p (log p - log_student)."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb_interleave as mla_rope

    model = copy.deepcopy(model)
    total = 0.0
    tiny = torch.finfo(torch.float32).tiny
    documents = model_tasks.attention_inputs_per_document(model, input_ids, lengths, lambda attention: True)
    for length, index, hidden, _, embeddings in documents:
        attn = model.model.layers[index].self_attn
        indexer = attn.indexer
        cos, sin = embeddings
        q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden))
        q = attn.q_b_proj(q_resid).view(1, length, -1, attn.qk_head_dim).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
        kv_pass, k_rot = torch.split(attn.kv_a_proj_with_mqa(hidden), [attn.kv_lora_rank,
                                                                        attn.qk_rope_head_dim], dim=-1)
        k_pass = attn.kv_a_layernorm(kv_pass).view(1, 1, length, attn.kv_lora_rank)
        q_rot, k_rot = mla_rope(q_rot, k_rot.view(1, 1, length, -1), cos, sin)
        keys, _ = attn.expand_kv(k_pass, k_rot)  # [1, H, S, D]
        query = torch.cat([q_pass, q_rot], dim=-1)[0]  # [H, S, D]
        selected = indexer(hidden, q_resid, embeddings, torch.ones(1, length, length, dtype=torch.bool)
                           .tril(), None)[0]
        qi = indexer.wq_b(q_resid).view(1, length, indexer.n_heads, indexer.head_dim)
        rope = indexer.qk_rope_head_dim
        qi_rot, qi_pass = torch.split(qi, [rope, indexer.head_dim - rope], dim=-1)
        ki = indexer.k_norm(indexer.wk(hidden)).unsqueeze(2)
        ki_rot, ki_pass = torch.split(ki, [rope, indexer.head_dim - rope], dim=-1)
        qi_rot, ki_rot = apply_rotary_pos_emb(qi_rot, ki_rot, cos, sin, unsqueeze_dim=2)
        qi = torch.cat([qi_rot, qi_pass], dim=-1)[0]  # [S, Hi, Di]
        ki = torch.cat([ki_rot, ki_pass], dim=-1)[0, :, 0]  # [S, Di]
        w = indexer.weights_proj(hidden)[0] * indexer.n_heads ** -0.5 * indexer.softmax_scale
        for t in range(length):
            chosen = [int(s) for s in selected[t].tolist() if 0 <= s <= t]
            logits = torch.einsum("hd,hnd->hn", query[:, t], keys[0][:, chosen]) * attn.scaling
            mass = torch.softmax(logits, dim=1).sum(0)
            p = mass / mass.sum().clamp_min(tiny)
            scores = (w[t][:, None] * torch.relu(qi[t] @ ki[chosen].T)).sum(0)
            log_student = torch.log_softmax(scores, dim=0)
            total += float((p * (torch.log(p.clamp_min(tiny)) - log_student)).sum())
    return coeff * total / sum(lengths)


def run_guide(rank: int, size: int, blocks: list[str]) -> dict[str, Any]:
    """The python blocks of docs/guide/deepseek-v32.md, as written, in one fresh namespace."""
    from sparsecp.models import deepseek_v32 as cp_v32

    namespace: dict[str, Any] = {"__name__": "guide"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"docs/guide/deepseek-v32.md snippet {index + 1}", "exec"), namespace)  # noqa: S102
    model = namespace["model"]
    state = cp_v32.context_parallel_state(model)
    assert state is not None
    indexer_grads = [p.grad for n, p in model.named_parameters() if ".indexer." in n]
    return {"logits": tuple(namespace["logits"].shape), "indexer_grad": all(g is not None and bool(g.any())
                                                                             for g in indexer_grads),
            "replays": state.stats.replays, "selections": state.stats.selections}


def calibrated_spill(rank: int, size: int, lengths: tuple[int, ...], forwards: int) -> dict[str, Any]:
    """spill with its default calibration (calibrate=True): ``forwards`` training forwards of one
    batch; the report, and the first forward's logits and ids (compared with the oracle)."""
    from sparsecp.models import deepseek_v32 as cp_v32
    from sparsecp.models._cp import calibration as _cp_calibration

    _cp_calibration.clear_cache()  # calibrate here, not from an earlier test's fit
    model = tiny_model(torch.float64)
    cp_v32.context_parallel(model, None, "spill")
    state = cp_v32.context_parallel_state(model)
    state.keep_last_ids = True
    # The refit's input, each rank's selector seconds of the last forward, injected: a
    # model's (3000 ns a row, 40 a key, 70 a kept key) of the rank's own sums, so that the
    # refit is accepted whatever the machine's load (measured times on a loaded machine can
    # rightly be refused for their residual: issue 43). The first fit is still measured.
    calibration = state.calibration
    measured = calibration.local_times

    def injected_times(st: Any) -> tuple[float, int] | None:
        times = measured(st)
        if times is None or calibration._pending is None:
            return times
        rows, widths, capped, _ = calibration._pending[st.rank]
        return 1e-9 * (3000 * rows + 40 * widths + 70 * capped), times[1]

    calibration.local_times = injected_times
    input_ids = packed_ids(lengths)
    ids, positions = cp_v32.shard_batch(input_ids, lengths)
    result: dict[str, Any] = {}
    for forward in range(forwards):
        out = model(input_ids=ids, position_ids=positions, document_lengths=lengths)
        out.logits.sum().backward()
        if forward == 0:
            result = {"logits": out.logits[0].detach(), "ids": [state.last_ids(layer).clone() for layer in
                                                                sorted(state.recorded)]}
    report = state.calibration.report
    result.update(source=report.source, model=None if report.model is None else report.model.id,
                  history=list(report.history), refits=report.refits,
                  refit_residual=report.refit_residual)
    return result
