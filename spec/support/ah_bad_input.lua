-- Bad calls whose error messages must be the same on Lua 5.4 and in
-- OpenResty (LuaJIT): returns the list of "case: message" lines, with the
-- positions (this file's lines) kept and the directory stripped.
return function(ah)
  local AsyncLocal, ALS, Snapshot, AsyncResource = ah.AsyncLocal, ah.AsyncLocalStorage, ah.Snapshot, ah.AsyncResource
  local v, als, snap = AsyncLocal.new(), ALS.new(), Snapshot.new()
  local r = AsyncResource.new("case", { requireManualDestroy = true })
  local hook = ah.createHook {}
  local cases = {
    { "AsyncLocal.new(5)", function() local _ = AsyncLocal.new(5) end },
    { "AsyncLocal.new{defualt}", function() local _ = AsyncLocal.new { defualt = 1 } end },
    { "AsyncLocal.new{name=3}", function() local _ = AsyncLocal.new { name = 3 } end },
    { "AsyncLocal:new()", function() local _ = AsyncLocal:new() end },
    { "v.get(5)", function() local _ = v.get(5) end },
    { "v.get({})", function() local _ = v.get({}) end },
    { "v.set(nil)", function() v.set(nil, 1) end },
    { "v:run(1)", function() local _ = v:run(1) end },
    { "v.run(5)", function() local _ = v.run(5, 1, print) end },
    { "v.disable(1)", function() v.disable(1) end },
    { "ALS.new{defaultvalue}", function() local _ = ALS.new { defaultvalue = 1 } end },
    { "als.getStore(1)", function() local _ = als.getStore(1) end },
    { "als.enterWith(true)", function() als.enterWith(true, 1) end },
    { "als:run(1, nil)", function() local _ = als:run(1, nil) end },
    { "als:exit(2)", function() local _ = als:exit(2) end },
    { "ALS.bind(1)", function() local _ = ALS.bind(1) end },
    { "ALS.snapshot()(1)", function() local _ = ALS.snapshot()(1) end },
    { "snap:run(nil)", function() local _ = snap:run(nil) end },
    { "Snapshot.run({})", function() local _ = Snapshot.run({}, print) end },
    { "Snapshot.wrap(1)", function() local _ = Snapshot.wrap(1) end },
    { "createHook(5)", function() local _ = ah.createHook(5) end },
    { "createHook{inti}", function() local _ = ah.createHook { inti = print } end },
    { "createHook{init=5}", function() local _ = ah.createHook { init = 5 } end },
    { "hook.enable(1)", function() hook.enable(1) end },
    { "AsyncResource.new('')", function() local _ = AsyncResource.new("") end },
    { "AsyncResource.new(x, -2)", function() local _ = AsyncResource.new("x", { triggerAsyncId = -2 }) end },
    { "AsyncResource.new(x, 1.5)", function() local _ = AsyncResource.new("x", 1.5) end },
    { "AsyncResource.new(x, 'y')", function() local _ = AsyncResource.new("x", "y") end },
    { "AsyncResource.new(x, {manual})", function() local _ = AsyncResource.new("x", { requireManualDestroy = 1 }) end },
    { "r:runInAsyncScope(nil)", function() local _ = r:runInAsyncScope(nil) end },
    { "r.emitDestroy(1)", function() r.emitDestroy(1) end },
    { "AsyncResource.bind(5)", function() local _ = AsyncResource.bind(5) end },
    { "install(5)", function() ah.install(5) end },
  }
  local out = {}
  for i, c in ipairs(cases) do
    local ok, e = pcall(c[2])
    out[i] = c[1] .. ": " .. (ok and "no error" or tostring(e):gsub("^[^:]*/", ""))
  end
  return out
end
