"""The bundled kernels (kerneldev.kernels): install into SGLang, releases."""

# The `--heads` limits of `kernels status`, here (a module with no imports) so that the CLI
# shows them without importing install.py (the probe, the releases, the sync core).
DEFAULT_HEADS = 64  # query heads per GPU of the attention layers (SGLang's tp_q_head_num)
# The probe allocates its tiny inputs on the live host, next to the server: bf16 q of
# PREFILL_TOKENS x heads x 512 is 75 MB at this bound, and DSv4 has 128 query heads in all.
MAX_HEADS = 1024
