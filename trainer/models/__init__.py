"""What every model family shares: the one ``BaseModel`` and its loader (a diffusers folder, a
single file, an embedded tiny twin; the family's own roles in ``trainer/families`` read the
parts), single files streamed tensor by tensor, base weights in fp8 / NF4 / int8 and block swap,
the tokenizers' offline lookup, and the text-conditioning record every family returns.

May import the config, the system and the families' torch-free layer; never the run.
"""
