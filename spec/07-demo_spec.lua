local H = require("helpers")

describe("the demo server", function()
  it("answers concurrent requests and every log line carries its own request id", function()
    local out = H.lua_ok('arg = {[0] = "examples/demo.lua", "6"}; dofile("examples/demo.lua")')
    assert.matches("6 requests, 35 log lines: every line carries its own request's id", out, 1, true)
    for i = 1, 6 do
      local id = ("req-%02d"):format(i)
      assert.matches(("[req %s] upstream answered pong:%s"):format(id, id), out, 1, true)
    end
    assert.matches("createHook trace of request 'traced'", out, 1, true)
    assert.matches("\n  uv_timer #%d+  %(1 callback%)", out)
    assert.not_matches("MISMATCH", out)
  end)
end)

describe("the async-resource pattern example", function()
  it("carries the id both ways into coroutines and plain callbacks", function()
    local out = H.lua_ok('dofile("examples/resource_pattern.lua")')
    for i = 1, 3 do
      for _, way in ipairs { "AsyncLocal  ", "resource fld" } do
        for _, where in ipairs { "after sleep", "in a timer callback" } do
          assert.matches(("[%s r%d] %s"):format(way, i, where), out, 1, true)
        end
      end
    end
    local n = select(2, out:gsub("\n", ""))
    assert.equal(12, n)
  end)
end)

describe("the README's quick start", function()
  it("prints each request's own id from a logger that receives none", function()
    H.lua_ok('dofile("examples/quickstart.lua")', {
      "[req-3] timer fired",
      "[req-2] timer fired",
      "[req-1] timer fired",
    })
  end)
end)
