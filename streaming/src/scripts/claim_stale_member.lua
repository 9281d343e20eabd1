-- Takes over one page of a sink member's pending events, or deletes its
-- consumer, only if the member is stale by Redis's own state and clock:
-- the decision is taken here, atomically, never from a replica.
-- KEYS[1]  stream key
-- KEYS[2]  the sink's members hash (rmap hash: member -> keep-alive, Redis
--          server time in ms, written by the member's renewals)
-- ARGV[1]  group
-- ARGV[2]  the member (consumer) to check
-- ARGV[3]  the claiming member (consumer)
-- ARGV[4]  member ttl in ms
-- ARGV[5]  page size: most entries claimed by one call
-- The member is stale when server time is past its keep-alive + ttl; when
-- it has no (readable) keep-alive, when its consumer has been idle longer
-- than the ttl.
-- Returns
--   {'alive'}            not stale: nothing changed
--   {'gone'}             no stream, group or consumer: nothing to do
--   {'claimed', entries} stale: up to ARGV[5] of its pending entries now
--                        belong to the claimer (XCLAIM min-idle 0; deleted
--                        entries leave the pending list); call again
--   {'deleted'}          stale and no pending entry left: consumer deleted
local ttl = tonumber(ARGV[4])
local page = tonumber(ARGV[5])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'gone'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '')
if at then
  if now <= at + ttl then
    return {'alive'}
  end
else
  -- Unregistered: judge by the consumer's own activity. The list holds one
  -- row per consumer of the group (bounded by its members, not by events).
  local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
  if not ok then
    return {'gone'}
  end
  local idle = nil
  for _, row in ipairs(consumers) do
    local name, row_idle = nil, nil
    for i = 1, #row - 1, 2 do
      if row[i] == 'name' then
        name = row[i + 1]
      elseif row[i] == 'idle' then
        row_idle = tonumber(row[i + 1])
      end
    end
    if name == ARGV[2] then
      idle = row_idle or 0
      break
    end
  end
  if idle == nil then
    return {'gone'}
  end
  if idle <= ttl then
    return {'alive'}
  end
end
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', page, ARGV[2])
if not ok then
  return {'gone'}
end
if #pending == 0 then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
  return {'deleted'}
end
local ids = {}
for i, row in ipairs(pending) do
  ids[i] = row[1]
end
-- At most `page` ids: unpack stays far below Lua's limit.
return {'claimed', redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, unpack(ids))}
