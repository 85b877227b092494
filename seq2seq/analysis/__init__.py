"""What runs and models are measured with after the fact: ablation statistics, learning curves,
the rank-collapse probe, attention maps."""
