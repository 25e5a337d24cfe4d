"""Serving: every engine that decodes or regenerates behind one interface, looked up by name.

base.py        the interface (`Decoder`, `Writer`) and an engine's registration (`Engine`)
catalogue.py   the one list of engines and the lookup by name (`engine=`, `data.regen_engine=`)
dmtp_loop.py   dmtp's own loop (dmtp.decode.SpecDecoder): every method, in this process
vllm/          vLLM: the engine adapter, the plug-in it loads, dmtp's proposers inside it (vLLM itself is
               imported only when an engine starts)
"""
