-- luv fs requests: each callback runs in the context of its request; the
-- synchronous forms are untouched.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

local tmpfile = H.tmpfile

describe("fs request callbacks", function()
  before_each(function() ah.install() end)
  after_each(function() ah.uninstall() end)

  it("fs open/read/close chains keep the context (both callback positions of fs_read)", function()
    local path = tmpfile("hello world")
    local v = AsyncLocal.new()
    local out = {}
    v:run("fs", function()
      uv.fs_open(path, "r", 438, function(err, fd)
        assert.is_nil(err)
        out[#out + 1] = v:get()
        uv.fs_read(fd, 5, 0, function(err2, data)
          out[#out + 1] = v:get() .. ":" .. data
          uv.fs_read(fd, 5, function(err3, data2) -- offset omitted
            out[#out + 1] = v:get() .. ":" .. tostring(data2)
            uv.fs_close(fd, function()
              out[#out + 1] = v:get() .. ":closed"
            end)
          end)
        end)
      end)
    end)
    run_loop()
    os.remove(path)
    assert.same({ "fs", "fs:hello", "fs:hello", "fs:closed" }, out)
  end)

  it("synchronous fs calls are untouched", function()
    local path = tmpfile("abc")
    local fd = assert(uv.fs_open(path, "r", 438))
    assert.equal("abc", uv.fs_read(fd, 3, 0))
    assert.is_true(uv.fs_close(fd))
    assert.equal(3, uv.fs_stat(path).size)
    os.remove(path)
  end)

  it("callable tables work where luv accepts them", function()
    local v = AsyncLocal.new()
    local got
    local cb = setmetatable({}, { __call = function(self, err, st) got = { v:get(), type(st) } end })
    v:run("callable", function() uv.fs_stat("/", cb) end)
    run_loop()
    assert.same({ "callable", "table" }, got)
  end)
end)
