-- luv getaddrinfo, getnameinfo and random: each callback runs in the
-- context of its request.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

describe("getaddrinfo, getnameinfo and random callbacks", function()
  before_each(function() ah.install() end)
  after_each(function() ah.uninstall() end)

  it("getaddrinfo('localhost'), getnameinfo and random", function()
    local v = AsyncLocal.new()
    local seen = {}
    v:run("dns", function()
      uv.getaddrinfo("localhost", nil, { socktype = "stream" }, function(err, res)
        assert.is_nil(err)
        assert.is_true(#res > 0)
        seen[#seen + 1] = v:get()
      end)
      uv.getnameinfo({ ip = "127.0.0.1", port = 80 }, function(err)
        seen[#seen + 1] = v:get()
      end)
      uv.random(8, nil, function(err, bytes)
        assert.equal(8, #bytes)
        seen[#seen + 1] = v:get()
      end)
    end)
    run_loop()
    assert.same({ "dns", "dns", "dns" }, seen)
  end)
end)
