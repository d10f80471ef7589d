"""Tallybook in the frameworks agents are written in: one module per framework, each
importable only when its framework is installed (`pip install "tallybook-sdk[<framework>]"`)."""
