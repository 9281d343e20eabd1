-- A node marks itself as reconciling its workers after Redis lost data or
-- went back in time, renews the mark while it does, and clears it when its
-- workers have re-registered and re-asserted what they run: the recovery
-- window (`recovering` in base.lua) lasts while any mark is live. A mark
-- lasts a worker TTL from its last renewal (a node that died stops holding
-- the window within a TTL) and never past 10 TTLs from the window's start
-- (a node that cannot finish does not stop admissions for good).
-- KEYS: base
-- ARGV: base, 4 node id, 5 worker ttl ms, 6 'set' | 'clear'
-- Returns 'set' | 'cleared' | 'late' (set refused: the window began more
--       than 10 TTLs ago)
local node, ttl = ARGV[4], tonumber(ARGV[5])
local now = now_ms()
local kept = {}
local marks = redis.call('HGET', FENCING, RECOVERY_MARKS) or ''
for id, until_ms in string.gmatch(marks, '(%S+) (%d+)') do
  if id ~= node and tonumber(until_ms) > now then
    kept[#kept + 1] = id .. ' ' .. until_ms
  end
end
local status = 'cleared'
if ARGV[6] == 'set' then
  local epoch = redis.call('HGET', FENCING, EPOCH)
  local since = tonumber(epoch and string.match(epoch, '^(%d+) ') or '') or now
  local until_ms = math.min(now + ttl, since + 10 * ttl)
  if until_ms > now then
    kept[#kept + 1] = node .. ' ' .. string.format('%d', until_ms)
    status = 'set'
  else
    status = 'late'
  end
end
if #kept == 0 then
  redis.call('HDEL', FENCING, RECOVERY_MARKS)
else
  redis.call('HSET', FENCING, RECOVERY_MARKS, table.concat(kept, ' '))
end
return status
