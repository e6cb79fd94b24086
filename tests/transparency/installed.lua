-- Transparency mode "installed": the library installed (coroutine patched;
-- luv integrated when the test requires it), nothing observing.  Loaded by
-- tests/transparency.sh with `lua5.4 -e 'require"transparency.installed"'`
-- before the test file; it keeps nothing of its own.
require("async_hooks").install()
