-- flotilla-streaming Lua prelude: the only Lua that writes stream entries.
-- Prepend it to a script to append to (or delete from) a flotilla stream in
-- the same atomic step as other writes. Entry format: fields n (event name),
-- t (topic, optional), p (payload bytes).

-- Appends an event; maxlen > 0 trims approximately (MAXLEN ~). topic may be
-- nil or false for none. Returns the new entry id.
local function stream_add(key, event_name, payload, maxlen, topic)
  local n = tonumber(maxlen) or 0
  -- Passed on as given: a number would be turned into text by Lua's
  -- "%.14g" on every call.
  maxlen = maxlen or n
  if topic then
    if n > 0 then
      return redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'n', event_name, 't', topic, 'p', payload)
    end
    return redis.call('XADD', key, '*', 'n', event_name, 't', topic, 'p', payload)
  end
  if n > 0 then
    return redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'n', event_name, 'p', payload)
  end
  return redis.call('XADD', key, '*', 'n', event_name, 'p', payload)
end

-- As stream_add, but only when the stream exists; returns false otherwise.
local function stream_add_if_exists(key, event_name, payload, maxlen, topic)
  if redis.call('EXISTS', key) == 0 then
    return false
  end
  return stream_add(key, event_name, payload, maxlen, topic)
end

-- Deletes one entry; returns the number deleted (0 or 1).
local function stream_remove(key, id)
  return redis.call('XDEL', key, id)
end
