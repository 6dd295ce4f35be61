-- wrk script for benchmarks/lab.py: POST one fixed V2 infer body on every request.
--
--   wrk -t1 -cC -dDs -s wrk_infer.lua http://H:P/v2/models/M/infer -- BODY            (V2 JSON body)
--   wrk -t1 -cC -dDs -s wrk_infer.lua http://H:P/v2/models/M/infer -- BODY HDRLEN     (binary extension)
--
-- With HDRLEN the body is Triton's binary tensor extension: HDRLEN bytes of JSON
-- header followed by the raw tensor bytes, sent with
-- `Inference-Header-Content-Length: HDRLEN` and `Content-Type: application/octet-stream`.
-- At the end one line `LAB_WRK {...}` carries counts, errors and latency percentiles (us).

local body_path, header_len
local prepared

function init(args)
  body_path = args[1]
  header_len = args[2]
  local fh = io.open(body_path or "", "rb")
  if fh == nil then
    error("wrk_infer.lua: cannot read body file '" .. tostring(body_path) .. "'")
  end
  local body = fh:read("*a")
  fh:close()
  local headers = {}
  if header_len ~= nil and header_len ~= "" then
    headers["Content-Type"] = "application/octet-stream"
    headers["Inference-Header-Content-Length"] = header_len
  else
    headers["Content-Type"] = "application/json"
  end
  prepared = wrk.format("POST", nil, headers, body)
end

function request()
  return prepared
end

function done(summary, latency, requests)
  local err = summary.errors
  local fields = {
    string.format('"requests":%d', summary.requests),
    string.format('"duration_us":%d', summary.duration),
    string.format('"bytes":%d', summary.bytes),
    string.format('"err_connect":%d', err.connect),
    string.format('"err_read":%d', err.read),
    string.format('"err_write":%d', err.write),
    string.format('"err_status":%d', err.status),
    string.format('"err_timeout":%d', err.timeout),
    string.format('"lat_mean_us":%.1f', latency.mean),
    string.format('"lat_max_us":%d', latency.max),
  }
  for _, q in ipairs({50, 90, 99, 99.9}) do
    local key = string.gsub(tostring(q), "%.", "_")
    fields[#fields + 1] = string.format('"lat_p%s_us":%d', key, latency:percentile(q))
  end
  io.write("LAB_WRK {" .. table.concat(fields, ",") .. "}\n")
end
