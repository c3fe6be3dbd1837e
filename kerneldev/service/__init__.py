"""The SGLang service on a host: restart, env file, variants, processes."""
