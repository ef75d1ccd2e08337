-- sdp-iwarp.lua: decode SDP over iWARP with Wireshark's InfiniBand SDP
-- dissector (infiniband_sdp), which Wireshark attaches only to InfiniBand.
-- softrnic's sdp package carries each SDP message as one RDMAP Send, and
-- Hello and HelloAck as the MPA Request's and Reply's private data (after
-- the IRD/ORD words of MPA revision 2).
--
--   tshark -X lua_script:sdp-iwarp.lua --enable-heuristic iwarp_mpa_tcp \
--     -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp \
--     --disable-heuristic smb_direct_iwarp -r capture.pcap
--
-- Wireshark's DDP dissector hands a heuristic at most one message per
-- frame and does not join a message's segments, so the script is a
-- post-dissector: it reads every FPDU of the frame from the MPA layer,
-- joins the segments of each Send per direction, and gives the whole
-- message to infiniband_sdp.

local ib_sdp = Dissector.get("infiniband_sdp")
local proto = Proto("sdp_iwarp", "SDP over iWARP")
local f_ulpdu = Field.new("iwarp_mpa.ulpdulength")
local f_pdata = Field.new("iwarp_mpa.privatedata")
local f_rev = Field.new("iwarp_mpa.rev")
local f_src = Field.new("tcp.srcport")

-- partial[direction][msn]: the segments of a Send so far (first pass).
local partial = {}
-- done[frame]: the messages that frame completed, kept for later passes.
local done = {}

local function hello(tvb, pinfo, tree)
	local pd = f_pdata()
	if not pd then
		return
	end
	local t = pd.range:tvb()
	local off = 0
	local rev = f_rev()
	if rev and rev() == 2 and t:len() >= 4 then
		off = 4
	end
	if t:len() - off < 16 then
		return
	end
	local mid, len = t(off, 1):uint(), t(off + 4, 4):uint()
	if (mid == 0 and len == 92 or mid == 1 and len == 196) and t:len() - off >= len then
		ib_sdp:call(t(off, len):tvb(), pinfo, tree)
	end
end

function proto.dissector(tvb, pinfo, tree)
	hello(tvb, pinfo, tree)
	if not pinfo.visited then
		local msgs = {}
		local dir = tostring(f_src() and f_src()() or 0)
		partial[dir] = partial[dir] or {}
		for _, fi in ipairs({ f_ulpdu() }) do
			local src, off, n = fi.source, fi.offset, fi.value
			-- ULPDU length (2), then DDP control: T (0x80) and L (0x40),
			-- the RDMAP control: opcode in the low four bits.
			if n >= 18 and src:len() >= off + 2 + n then
				local ddp, op = src(off + 2, 1):uint(), src(off + 3, 1):uint() % 16
				local untagged = ddp < 128
				local last = ddp % 128 >= 64
				-- Send, Send with Invalidate, with SE, with both.
				if untagged and (op == 3 or op == 4 or op == 5 or op == 6) then
					local qn, msn = src(off + 8, 4):uint(), src(off + 12, 4):uint()
					if qn == 0 then
						local b = partial[dir][msn] or ByteArray.new()
						b:append(src(off + 20, n - 18):bytes())
						if last then
							partial[dir][msn] = nil
							msgs[#msgs + 1] = b
						else
							partial[dir][msn] = b
						end
					end
				end
			end
		end
		done[pinfo.number] = msgs
	end
	-- Each message on its own: infiniband_sdp throws at a Data message
	-- with no data (a credit update), which must not cost the others.
	for i, b in ipairs(done[pinfo.number] or {}) do
		if b:len() >= 16 then
			pcall(ib_sdp.call, ib_sdp, b:tvb("SDP message " .. i), pinfo, tree)
		end
	end
end
register_postdissector(proto)
