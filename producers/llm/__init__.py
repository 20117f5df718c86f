"""Talking to LLM servers: the server pool (`pool`, needs the llm extra's aiohttp) and one
turn's chat request and reply (`chat`)."""
