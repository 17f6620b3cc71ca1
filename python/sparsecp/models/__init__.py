"""sparsecp.models: real models made context-parallel with sparsecp.

``sparsecp.models.deepseek_v4``: transformers' ``DeepseekV4ForCausalLM`` trained under
context parallelism (transformers 5.23, an optional dependency: ``pip install
'sparsecp[models]'``; it is imported only when that module's functions are called, and a later
version runs only if the V4 modules the integration re-implements are unchanged).
``sparsecp.models._cp_training`` holds what any model integration shares: CP groups and
meshes, batch and label shards, the loss over the global batch's valid tokens, gradient
reduction of replicated weights, the MoE load-balancing loss of whole packed rows.
"""
