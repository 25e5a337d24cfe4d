"""Serving engines behind one interface: a `Decoder` per method, a regeneration writer, looked up by name.

base.py        the interface (`Decoder`, `Writer`) and an engine's registration (`Engine`)
catalogue.py   the one list of engines and the lookup by name (`engine=`, `data.regen_engine=`)
dmtp_loop.py   dmtp's own loop (dmtp.decode.SpecDecoder): every method, in this process
vllm.py        vLLM (dmtp.serving; vLLM imported only when an engine starts)
"""
