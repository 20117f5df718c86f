"""rollstream schemas: the contract between producers and consumer."""
