"""Model pairs from transformers configs: the config reader, the pairs file and the CLI options."""
