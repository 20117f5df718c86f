"""Tools for LLM agents: the calls read from a reply (`parsers`), the `python` sandbox
(`sandbox`), and the loop that runs a turn's calls and answers them (`loop`). See
docs/tools.md."""
