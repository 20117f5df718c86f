"""rollstream command line and local launcher."""
