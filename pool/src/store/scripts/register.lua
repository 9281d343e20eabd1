-- Registers (or re-registers) a worker with its creation time on server
-- time and a first keep-alive.
-- KEYS: base, 9 keepalive hash, 10 keepalive revision
-- ARGV: base, 4 worker id, 5 worker info (JSON object), 6 keepalive channel
-- Returns the server time in ms.
local now = now_ms()
local info = cjson.decode(ARGV[5])
info['created_at_ms'] = now
mset(WORKERS, ARGV[4], cjson.encode(info))
rmap_set(KEYS[9], KEYS[10], ARGV[6], ARGV[4], string.format('%d', now))
return now
