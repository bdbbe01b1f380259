// permessage-deflate (RFC 7692): what the two sides agree in `Sec-WebSocket-Extensions`. Pure
// Swift; the compression itself is in Deflate/ (zlib).

/// The agreed parameters of permessage-deflate.
struct DeflateAgreement: Sendable, Equatable {
    /// The server resets its compressor after each message.
    var serverNoContextTakeover = false
    /// The client resets its compressor after each message.
    var clientNoContextTakeover = false
    /// The server's compressor's window (9–15 bits).
    var serverMaxWindowBits = 15
    /// The client's compressor's window (9–15 bits).
    var clientMaxWindowBits = 15

    /// One extension of a `Sec-WebSocket-Extensions` list: its name and parameters (a
    /// parameter without a value has nil), or nil when malformed.
    static func parseList(_ values: [String]) -> [(name: String, parameters: [(String, String?)])] {
        var extensions: [(name: String, parameters: [(String, String?)])] = []
        for value in values {
            for item in value.split(separator: ",") {
                let parts = item.split(separator: ";", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
                guard let name = parts.first, !name.isEmpty else { continue }
                var parameters: [(String, String?)] = []
                for part in parts.dropFirst() where !part.isEmpty {
                    if let equals = part.firstIndex(of: "=") {
                        var value = part[part.index(after: equals)...].trimmingCharacters(in: .whitespaces)
                        if value.count >= 2 && value.hasPrefix("\"") && value.hasSuffix("\"") { value = String(value.dropFirst().dropLast()) }
                        parameters.append((part[..<equals].trimmingCharacters(in: .whitespaces).lowercased(), value))
                    } else {
                        parameters.append((part.lowercased(), nil))
                    }
                }
                extensions.append((name.lowercased(), parameters))
            }
        }
        return extensions
    }

    /// A window-bits value: 8–15, digits only.
    private static func bits(_ text: String?) -> Int? {
        guard let text, text.count <= 2, text.allSatisfy(\.isASCII), let value = Int(text), (8...15).contains(value) else { return nil }
        return value
    }

    /// The server's answer to a client's offers: the first acceptable `permessage-deflate`
    /// offer, as the response's extension text and the agreement; nil when none is acceptable
    /// (the server then answers without compression).
    static func answer(offers values: [String], settings: WebSocket.Compression) -> (response: String, agreement: DeflateAgreement)? {
        offers: for offer in parseList(values) where offer.name == "permessage-deflate" {
            var agreement = DeflateAgreement()
            var seen = Set<String>()
            var serverBitsAsked: Int?
            for (name, value) in offer.parameters {
                guard seen.insert(name).inserted else { continue offers }  // a parameter twice
                switch name {
                case "server_no_context_takeover":
                    guard value == nil else { continue offers }
                    agreement.serverNoContextTakeover = true
                case "client_no_context_takeover":
                    guard value == nil else { continue offers }
                    agreement.clientNoContextTakeover = true
                case "server_max_window_bits":
                    guard let asked = bits(value) else { continue offers }
                    serverBitsAsked = asked
                case "client_max_window_bits":
                    // Only a limit the client accepts: the server does not use it.
                    if value != nil && bits(value) == nil { continue offers }
                default:
                    continue offers
                }
            }
            agreement.serverMaxWindowBits = min(settings.maxWindowBits, serverBitsAsked ?? 15)
            // zlib's raw DEFLATE has no 8-bit window: decline rather than break the limit.
            guard agreement.serverMaxWindowBits >= 9 else { continue offers }
            if !settings.contextTakeover { agreement.serverNoContextTakeover = true }
            var response = "permessage-deflate"
            if agreement.serverNoContextTakeover { response += "; server_no_context_takeover" }
            if agreement.clientNoContextTakeover { response += "; client_no_context_takeover" }
            if serverBitsAsked != nil || agreement.serverMaxWindowBits < 15 {
                response += "; server_max_window_bits=\(agreement.serverMaxWindowBits)"
            }
            return (response, agreement)
        }
        return nil
    }

    /// A client's offer for `settings`.
    static func offer(_ settings: WebSocket.Compression) -> String {
        var offer = "permessage-deflate; client_max_window_bits"
        if !settings.contextTakeover { offer += "; client_no_context_takeover" }
        return offer
    }

    /// A client's reading of the server's answer; nil when it is not a valid answer to `offer`.
    static func accepted(_ values: [String], settings: WebSocket.Compression) -> DeflateAgreement? {
        let extensions = parseList(values)
        guard extensions.count == 1, extensions[0].name == "permessage-deflate" else { return nil }
        var agreement = DeflateAgreement()
        var seen = Set<String>()
        for (name, value) in extensions[0].parameters {
            guard seen.insert(name).inserted else { return nil }
            switch name {
            case "server_no_context_takeover":
                guard value == nil else { return nil }
                agreement.serverNoContextTakeover = true
            case "client_no_context_takeover":
                guard value == nil else { return nil }
                agreement.clientNoContextTakeover = true
            case "server_max_window_bits":
                guard let bits = bits(value) else { return nil }
                agreement.serverMaxWindowBits = bits
            case "client_max_window_bits":
                guard let bits = bits(value), bits >= 9 else { return nil }
                agreement.clientMaxWindowBits = bits
            default:
                return nil
            }
        }
        agreement.clientMaxWindowBits = min(agreement.clientMaxWindowBits, settings.maxWindowBits)
        if !settings.contextTakeover { agreement.clientNoContextTakeover = true }
        return agreement
    }
}
