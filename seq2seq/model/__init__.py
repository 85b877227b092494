"""The Transformer: its config schema, attention, attention sites, layers and training loss."""
