"""rollstream producers: env loops, policies, the producer process."""
