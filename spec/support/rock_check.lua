-- `make rock-purelua`: run by a runtime whose package paths hold only the
-- installed rock of the other runtimes and the system's luv: the module
-- loads from there, with its C helper, and a luv timer carries a value.
local ah = require("async_hooks").install()
local uv = require("luv")
assert(require("async_hooks.backend.luv_lua").luvcb, "the C helper did not load")
local v, got = ah.AsyncLocal.new(), nil
local t = uv.new_timer()
v:run("rock", function()
  t:start(1, 0, function()
    got = v:get()
    t:close()
  end)
end)
uv.run()
assert(got == "rock", "the timer lost the value")
print("rock-purelua: " .. (arg[1] or "?") .. ": ok")
