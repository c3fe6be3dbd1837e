"""The bundled kernels (kerneldev.kernels): install into SGLang, releases."""
