"""Framework adapters: sandcell as a tool of an agent framework.

Each module wraps an :class:`~sandcell.Executor` (in-process) or a
:class:`~sandcell.client.Client` (the service) and a profile into one framework's tool or code
executor, and imports its framework only when it is imported itself, so ``import sandcell``
never pulls in a framework:

* :mod:`sandcell.adapters.pydantic_ai`: a pydantic-ai ``Tool``
* :mod:`sandcell.adapters.langchain`: a LangChain ``StructuredTool`` (sync and async)
* :mod:`sandcell.adapters.openai_agents`: an OpenAI Agents SDK ``FunctionTool``
* :mod:`sandcell.adapters.smolagents`: a smolagents ``PythonExecutor`` backed by a session

The shared parts (what a runner is, the tool's text) are in :mod:`sandcell.adapters.common`.
See docs/adapters.md.
"""
