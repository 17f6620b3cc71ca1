"""sparsecp.models: real models made context-parallel with sparsecp.

``sparsecp.models.deepseek_v4``: transformers' ``DeepseekV4ForCausalLM`` trained under
context parallelism (transformers >= 5.8, an optional dependency: ``pip install
'sparsecp[models]'``; it is imported only when that module's functions are called).
"""
